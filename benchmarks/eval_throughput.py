"""`dualmem eval` throughput against a real HTTP endpoint: all RealMem personas at once vs the longest persona alone.

A loopback OpenAI-compatible server (:class:`dualmem.standin.OpenAIStandin`, in a
process of its own, as a real endpoint is) answers every call after a fixed latency (default 300 ms) with scripted JSON
(the writer gets one fact and one insight per chunk, judges a valid verdict,
the reader a short text). The benchmark runs what ``dualmem eval -d realmem
DIR -f dualmem --limit N --judge MODEL`` runs (``run_eval`` with the same
arguments, in this process: interpreter start-up and first imports are paid
by a warm-up before the clock starts), through ``langchain_openai.ChatOpenAI``
over real HTTP, the dualmem framework writing to LanceDB on disk.

1. All personas at concurrency 9: wall time, calls, calls/s. Every call is
   attributed to its persona (writer and reader prompts name the persona,
   judge prompts carry its question). The personas run in worker processes
   (``eval_workers`` 0); the workers' forkserver imports dualmem once per
   evaluating process. It is run twice: first cold (the forkserver starts
   inside the clock: ``ratio_cold_workers``), then warm (its imports paid, as
   the warm-up paid this process's: ``ratio``, the figure held to the target).
2. The persona with the most calls, alone at concurrency 1: its sequential
   chain of calls end to end (the critical path: the concurrent run cannot
   end sooner). It must make exactly the calls attributed to it in step 1.

ratio = wall(all) / wall(longest alone), target <= 1.2. Also reported: the
calls-only bound (its calls x latency), which leaves out the CPU work between
calls. The embedder defaults to ``hash:384`` (no model on the CPU): on a 2-core
machine the bundled MiniLM's CPU work, not the endpoint, limits throughput —
``--embedder bundled:all-MiniLM-L6-v2`` measures that.

    python benchmarks/eval_throughput.py --limit 3    # prints the figures, writes benchmarks/results/eval_throughput.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

from fixtures.standin import OpenAIStandin  # noqa: E402

from dualmem.config import Settings  # noqa: E402
from dualmem.datasets import load_realmem  # noqa: E402
from dualmem.evals.run import run_eval  # noqa: E402

TARGET = 1.2
NAME_IN_SYSTEM = re.compile(r"You are ([^.\n]+)\.")


def tagger(names: dict[str, str], questions: dict[str, str]) -> Any:
    """Return a function naming the persona of a request: by ``You are NAME.`` (writer, reader), else by its question (judges)."""

    def tag(body: dict[str, Any]) -> str | None:
        texts = [m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content")) for m in body.get("messages") or []]
        for text in texts:
            if (m := NAME_IN_SYSTEM.search(text or "")) and m.group(1) in names:
                return names[m.group(1)]
        joined = "\n".join(t or "" for t in texts)
        return next((pid for q, pid in questions.items() if q in joined), None)

    return tag


def _serve(conn: Any, latency: float, names: dict[str, str] | None, questions: dict[str, str] | None) -> None:
    """Child process: serve the stand-in until told to stop, then send back its call log."""
    with OpenAIStandin(latency_s=latency, tagger=tagger(names, questions) if names else None) as server:
        conn.send(server.base_url)
        conn.recv()
        conn.send(server.calls)


@contextmanager
def standin_process(latency: float, names: dict[str, str] | None = None, questions: dict[str, str] | None = None) -> Iterator[Any]:
    """Run the stand-in endpoint in a process of its own, as a real endpoint runs outside the evaluating one
    (in this process its HTTP handling would take the evaluation's interpreter lock); ``.calls`` is filled on exit."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, latency, names, questions), daemon=True)
    proc.start()
    handle = SimpleNamespace(base_url=parent.recv(), calls=[])
    try:
        yield handle
    finally:
        parent.send("stop")
        handle.calls = parent.recv()
        proc.join(30)


def _evaluate(data: Path, out: Path, args: argparse.Namespace, base_url: str, concurrency: int,
              personas: list[str] | None = None) -> tuple[float, Path]:
    """Run the evaluation as `dualmem eval` would; return (seconds, run folder)."""
    settings = Settings(chat_model="openai-compatible:standin", openai_base_url=base_url, openai_api_key="bench",
                        embedder=args.embedder, concurrency=concurrency,
                        store_uri=str(out / "lancedb"), checkpoint_path=str(out / "checkpoints.sqlite"))  # fresh memory per run
    started = time.perf_counter()
    run_dir = run_eval("realmem", data, "dualmem", judge="openai-compatible:standin", limit=args.limit, out=out, settings=settings,
                       upload=False, progress=False, personas=personas)
    return time.perf_counter() - started, run_dir


def main() -> None:
    """Run the benchmark; print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO / ".." / "shared" / "data" / "realmem", help="RealMem folder (9 personas)")
    parser.add_argument("--limit", type=int, default=3, help="queries per persona (replay up to the session of the last one)")
    parser.add_argument("--latency", type=float, default=0.3, help="seconds the stand-in waits before each answer")
    parser.add_argument("--concurrency", type=int, default=9, help="personas evaluated at once")
    parser.add_argument("--embedder", default="hash:384", help="embedder of the store (default hash:384: no model on the CPU)")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench-throughput", help="scratch folder (deleted first)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "eval_throughput.json")
    args = parser.parse_args()
    if not args.data.exists():
        raise SystemExit(f"{args.data} not found: the benchmark needs the RealMem personas of ../shared/data")

    items = load_realmem(args.data).items
    names = {it.dialogue.persona.name: it.dialogue.id for it in items if it.dialogue.persona}
    questions = {q.text[:200]: it.dialogue.id for it in items for q in it.queries[: args.limit]}
    shutil.rmtree(args.runs, ignore_errors=True)
    load_before = round(os.getloadavg()[0], 2)  # other work on the machine slows every figure below
    with standin_process(0.0) as warm:  # imports, embedder and caches: paid before any clock starts
        warm_item = next(it for it in items if it.dialogue.id == min(names.values()))
        _evaluate(args.data, args.runs / "warm-up", args, warm.base_url, 1, [warm_item.dialogue.id])
    with standin_process(args.latency) as cold:  # the workers' forkserver starts inside this clock
        wall_cold, _ = _evaluate(args.data, args.runs / "all-cold", args, cold.base_url, args.concurrency)
    with standin_process(args.latency, names, questions) as server:  # its imports paid, as the warm-up paid this process's
        wall, run_dir = _evaluate(args.data, args.runs / "all", args, server.base_url, args.concurrency)
    calls = server.calls
    per_persona = Counter(c["tag"] for c in calls)
    unattributed = per_persona.pop(None, 0)
    longest, longest_calls = per_persona.most_common(1)[0]
    with standin_process(args.latency) as alone:
        solo, _ = _evaluate(args.data, args.runs / "longest-alone", args, alone.base_url, 1, [longest])
    calls_only = longest_calls * args.latency
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary["ingest"]["failed_sessions"]:  # a run that wrote nothing would look fast: refuse its figures
        raise SystemExit(f"{len(summary['ingest']['failed_sessions'])} sessions failed to ingest: {summary['ingest']['errors'][:1]}")
    busy = sum(c["end"] - c["start"] for c in calls)
    result = {
        "benchmark": "dualmem eval over all RealMem personas at once vs the longest persona alone (its sequential chain of calls)",
        "command": f"python benchmarks/eval_throughput.py --limit {args.limit} --latency {args.latency} "
                   f"--concurrency {args.concurrency} --embedder {args.embedder}",
        "personas": len(items), "limit": args.limit, "latency_s": args.latency, "concurrency": args.concurrency,
        "embedder": args.embedder, "workers": summary["meta"].get("workers"), "queries": summary["n_queries"], "sessions_ingested": summary["ingest"]["sessions"],
        "calls": len(calls), "writer_calls_expected": summary["ingest"].get("llm_calls"), "calls_by_kind": dict(Counter(c["schema"] or "reply" for c in calls)),
        "calls_per_persona": dict(sorted(per_persona.items())), "unattributed_calls": unattributed,
        "wall_s": round(wall, 2), "calls_per_s": round(len(calls) / wall, 2), "mean_calls_in_flight": round(busy / wall, 2),
        "longest_persona": longest, "longest_calls": longest_calls, "longest_alone_calls": len(alone.calls),
        "critical_path_s": round(solo, 2), "ratio": round(wall / solo, 3), "target_ratio": TARGET, "passed": wall / solo <= TARGET,
        "wall_cold_workers_s": round(wall_cold, 2), "ratio_cold_workers": round(wall_cold / solo, 3), "calls_cold_workers": len(cold.calls),
        "calls_only_s": round(calls_only, 2), "ratio_to_calls_only": round(wall / calls_only, 3),
        "load_average_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)}, "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"all {len(items)} personas at concurrency {args.concurrency}: {len(calls)} calls in {wall:.1f} s = "
          f"{result['calls_per_s']} calls/s ({result['mean_calls_in_flight']} in flight on average)")
    print(f"critical path: {longest} alone, {len(alone.calls)} calls in {solo:.1f} s "
          f"(calls only: {longest_calls} x {args.latency} s = {calls_only:.1f} s)")
    print(f"wall / critical path = {result['ratio']} (target <= {TARGET}): {'PASS' if result['passed'] else 'FAIL'}; "
          f"wall / calls only = {result['ratio_to_calls_only']}")
    print(f"with the workers' forkserver started inside the clock (the first run of a process): {wall_cold:.1f} s, "
          f"ratio {result['ratio_cold_workers']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
