"""What memory costs: `dualmem eval` of every framework on the bundled sample, tokens and calls per phase per framework.

The product's own entry point (:func:`dualmem.evaluate.run_evals`, what ``dualmem
eval -f a,b,...`` calls) runs the ten frameworks together on the bundled RoleMemo
sample (one persona, four sessions, three queries), every model — writer,
reader, the frameworks' own calls, the judge — a loopback OpenAI-compatible
stand-in (``tests/fixtures/standin.py``) that answers with realistic lengths
and reports ``usage`` as an endpoint does (prompt tokens: the words of the
request; completion tokens: the words of the answer): the writer three facts
and two insights quoting the chunk, the reader a reply of about 120 words, the
judge a sentence of reasoning and a score, any other structured answer a filled
instance of its schema. Per framework, from its ``summary.json``: calls and
input / output tokens per phase (writing, retrieval, answering, judging),
tokens and calls per query, the writer's input tokens per history token, and
the quality bought (Recall@10 of gold facts and insight, the judges' means).
The summaries' totals are checked against the stand-in's own log.

    python benchmarks/eval_cost.py      # prints the figures, writes benchmarks/results/eval_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("LANGSMITH_TRACING", "false")
for key in ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY"):
    os.environ.pop(key, None)  # judges stay offline

FRAMEWORKS = (
    "dualmem",
    "full-context",
    "mem0-classic",
    "langmem",
    "memagent",
    "memorybank",
    "amem",
    "emotional-rag",
    "bookmarks",
    "raw-turns",
)
REPLY_WORDS = 120


def _words(messages: list[dict[str, Any]]) -> list[str]:
    text = " ".join(str(m.get("content") or "") for m in messages[-1:])
    return [w for w in text.split() if w.isalpha()] or ["nothing"]


def realistic(name: str | None, schema: dict[str, Any] | None, messages: list[dict[str, Any]]) -> Any:
    """Answer one request with the length a real model's answer has (see the module docstring)."""
    from fixtures.standin import default_script

    from dualmem.testing import filled_instance

    words = _words(messages)
    line = lambda start, n: " ".join((words * (1 + n // len(words)))[start % len(words) :][:n])  # noqa: E731
    if name == "MemoryUpdate":
        return {
            "facts": [
                {"op": "ADD", "id": f"N{i}", "text": f"User said: {line(i * 25, 25)}", "turn_ids": []}
                for i in (1, 2, 3)
            ],
            "insights": [
                {
                    "op": "ADD",
                    "id": f"M{i}",
                    "text": f"I read this as telling: {line(i * 20, 30)}",
                    "fact_ids": ["N1", "N2"],
                }
                for i in (1, 2)
            ],
        }
    if schema is None:
        return f"Thinking of what you told me, {line(0, REPLY_WORDS)}."
    if name in ("RolePlayVerdict", "AnswerVerdict", "CorrectnessVerdict"):
        verdict = default_script(name, schema, messages)
        return {**verdict, "reasoning": f"The answer {line(3, 30)}."}
    return filled_instance(schema, line(0, 30))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate every framework on the sample against the stand-in; return the figures."""
    from fixtures.standin import OpenAIStandin

    from dualmem.config import Settings
    from dualmem.datasets import sample_path
    from dualmem.evals.cost import PHASES
    from dualmem.evaluate import run_evals

    out = Path(tempfile.mkdtemp(prefix="eval-cost-"))
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    with OpenAIStandin(latency_s=0.0, script=realistic) as server:
        settings = Settings(
            embedder=args.embedder,
            openai_base_url=server.base_url,
            openai_api_key="benchmark",
            judge_repetitions=args.judge_repetitions,
            concurrency=args.concurrency,
            prices=args.prices,
        )
        started = time.perf_counter()
        dirs = run_evals(
            "rolememo",
            sample_path(),
            frameworks,
            out=out,
            model="openai-compatible:standin",
            judge="openai-compatible:standin",
            settings=settings,
            progress=False,
            ragas=False,
        )
        seconds = time.perf_counter() - started
    logged = {
        "calls": len(server.calls),
        "input_tokens": sum(c["usage"]["prompt_tokens"] for c in server.calls),
        "output_tokens": sum(c["usage"]["completion_tokens"] for c in server.calls),
    }
    rows: dict[str, Any] = {}
    for name, folder in zip(frameworks, dirs, strict=True):
        summary = json.loads((folder / "summary.json").read_text())
        cost, n = summary["cost"], summary["n_queries"]
        rows[name] = {
            "phases": {
                p: {k: cost["phases"][p][k] for k in ("calls", "input_tokens", "output_tokens")} for p in PHASES
            },
            "calls_per_query": round(cost["total"]["calls"] / n, 2),
            "tokens_per_query": cost["tokens_per_query"],
            "writer_input_per_history_token": cost["writer_input_per_history_token"],
            "history_tokens": cost["history_tokens"],
            "counted_tokens": cost["total"]["counted_tokens"],
            "money": (cost.get("money") or {}).get("total"),
            "quality": {k: summary["overall"].get(k) for k in ("fact_recall@10", "insight_recall@10")},
            "judges": {k: v["mean"] for k, v in summary["judges"].items()},
            "errors": summary["n_query_errors"]
            + summary["ingest"]["failed_chunks"]
            + len(summary["ingest"]["failed_sessions"]),
        }
    counted = {
        k: sum(r["phases"][p][k] for r in rows.values() for p in PHASES)
        for k in ("calls", "input_tokens", "output_tokens")
    }
    return {
        "command": " ".join(["python benchmarks/eval_cost.py", *sys.argv[1:]]),
        "dataset": "bundled RoleMemo sample (1 persona, 4 sessions, 3 queries)",
        "endpoint": "loopback OpenAI-compatible stand-in, realistic answer lengths, usage = words",
        "settings": {"embedder": args.embedder, "judge_repetitions": args.judge_repetitions, "prices": args.prices},
        "frameworks": rows,
        "endpoint_log": logged,
        "summaries_total": counted,
        "agrees_with_endpoint": counted == logged,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    """Run, print and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--embedder", default="bundled:all-MiniLM-L6-v2")
    parser.add_argument("--judge-repetitions", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prices", default="", help="price table, as the prices setting (default: tokens only)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "eval_cost.json")
    args = parser.parse_args()
    result = run(args)
    for name, row in result["frameworks"].items():
        phases = ", ".join(
            f"{p} {v['calls']} calls / {v['input_tokens'] + v['output_tokens']} tok" for p, v in row["phases"].items()
        )
        print(
            f"{name:14s} {row['tokens_per_query']:>8} tok/query  writer in/history {row['writer_input_per_history_token']}  {phases}"
        )
    print(
        f"agrees with the endpoint's log: {result['agrees_with_endpoint']} ({result['endpoint_log']}); {result['seconds']} s"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
