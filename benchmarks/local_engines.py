"""Speed of the bundled chat model on each local engine: prompt processing and generation.

For each engine installed (transformers always; llama.cpp with ``make llamacpp``)
the bundled SmolLM2-135M is loaded through :func:`dualmem.models.load_chat_model`
and timed on:

- **prompt**: a ~1,150-token prompt answered with one token (the prompt's
  processing dominates; each repetition changes the prompt's start so that no
  engine reuses a cached prefix);
- **generation**: a short prompt answered with up to ``--new-tokens`` tokens;
- **demo**: ``dualmem demo`` end to end (the shipped writer adapter writes the
  bundled sample's 4 chunks, the base model answers), in a fresh process with
  ``DUALMEM_LOCAL_ENGINE`` set: first with an empty model cache, as after
  install, then again (the cache filled).

The memory frameworks' calls are prompt-heavy (a chunk, a summary, similar
memories), so the prompt figure predicts their run time better than the
generation one. Writes ``benchmarks/results/local_engines.json``.

Run: ``python benchmarks/local_engines.py [--repeats 3] [--new-tokens 128]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dualmem.config import Settings  # noqa: E402
from dualmem.datasets._validate import write_json_atomic  # noqa: E402
from dualmem.models import load_chat_model  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "local_engines.json"
TARGET_DEMO_S = 60.0  # the issue: `dualmem demo` after install within a minute on 2 cores
FILLER = " ".join(f"Sentence {i} is about a trip to the mountains with friends and a dog." for i in range(70))


def _usage(message: Any, key: str) -> int:
    return int(dict(message.usage_metadata or {}).get(key, 0))


def time_engine(engine: str, repeats: int, new_tokens: int) -> dict[str, Any]:
    """Return prompt and generation throughput of ``engine`` (median over ``repeats``)."""
    from langchain_core.messages import HumanMessage

    prompt_model = load_chat_model("local:smollm2", Settings(local_engine=engine, max_new_tokens=1, temperature=0.0))
    gen_model = load_chat_model(
        "local:smollm2", Settings(local_engine=engine, max_new_tokens=new_tokens, temperature=0.0)
    )
    prompt_model.invoke([HumanMessage(content="warm up")])
    prompt_rates, prompt_tokens, gen_rates, gen_tokens = [], 0, [], 0
    for i in range(repeats):
        started = time.perf_counter()
        answer = prompt_model.invoke([HumanMessage(content=f"Run {i} of {repeats}. {FILLER}")])
        seconds = time.perf_counter() - started
        prompt_tokens = _usage(answer, "input_tokens")
        prompt_rates.append(prompt_tokens / seconds)
        started = time.perf_counter()
        answer = gen_model.invoke([HumanMessage(content=f"Write a long story about a dog named Rex number {i}.")])
        seconds = time.perf_counter() - started
        gen_tokens = _usage(answer, "output_tokens")
        gen_rates.append(gen_tokens / seconds)
    return {
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_per_s": round(statistics.median(prompt_rates), 1),
        "generated_tokens": gen_tokens,
        "generation_tokens_per_s": round(statistics.median(gen_rates), 1),
    }


def time_demo(engine: str) -> dict[str, Any]:
    """Return the wall seconds of ``dualmem demo`` on ``engine`` with an empty model cache and again, and what the
    writer wrote (facts, insights, failed chunks) in the first run."""
    dualmem = Path(sys.executable).with_name("dualmem")
    seconds, wrote = [], ""
    with tempfile.TemporaryDirectory(prefix="demo-") as tmp:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "DUALMEM_LOCAL_ENGINE": engine,
            "DUALMEM_CACHE": f"{tmp}/cache",
            "COLUMNS": "200",
        }
        for run in ("first", "again"):
            started = time.perf_counter()
            done = subprocess.run(
                [str(dualmem), "demo", "--store", f"{tmp}/{run}"], env=env, capture_output=True, text=True, check=True
            )
            seconds.append(round(time.perf_counter() - started, 1))
            wrote = wrote or done.stdout
    found = re.search(r"(\d+) facts and (\d+) insights written, (\d+) chunk\(s\) failed", wrote)
    facts, insights, failed = (int(g) for g in found.groups()) if found else (None, None, None)
    return {
        "demo_first_s": seconds[0],
        "demo_again_s": seconds[1],
        "facts": facts,
        "insights": insights,
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time every installed engine, print a table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per engine (median reported)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated in the generation test")
    parser.add_argument("--out", type=Path, default=OUT, help="JSON file written with the results")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    engines = ["transformers"] + (["llama.cpp"] if importlib.util.find_spec("llama_cpp") else [])
    results: dict[str, Any] = {
        "benchmark": "bundled SmolLM2-135M per local engine: prompt processing, generation and `dualmem demo`",
        "command": f"python benchmarks/local_engines.py --repeats {args.repeats} --new-tokens {args.new_tokens}",
        "engines": {e: {**time_engine(e, args.repeats, args.new_tokens), **time_demo(e)} for e in engines},
        "target_demo_s": TARGET_DEMO_S,
        "not_installed": [] if "llama.cpp" in engines else ["llama.cpp (make llamacpp)"],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    for name, row in results["engines"].items():
        print(
            f"{name:13s} prompt {row['prompt_tokens_per_s']:8.1f} tok/s ({row['prompt_tokens']} tokens)   "
            f"generation {row['generation_tokens_per_s']:6.1f} tok/s ({row['generated_tokens']} tokens)   "
            f"demo {row['demo_first_s']} s, again {row['demo_again_s']} s"
        )
    print(f"wrote {write_json_atomic(args.out, results)}")
    return results


if __name__ == "__main__":
    main()
