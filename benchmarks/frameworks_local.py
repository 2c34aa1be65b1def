"""Every registered memory framework through `dualmem eval` on the bundled local model.

The acceptance run of the frameworks issue: for each name of the registry,
``dualmem eval --dataset realmem <Sophie_Dubois> --framework NAME --limit N``
with the bundled SmolLM2-135M (``local:smollm2``) as chat model and the bundled
MiniLM embedder, each in its own run folder, then ``dualmem eval compare`` over
all of them. It checks that every framework ingests, retrieves, answers and
writes its report offline; the tiny model's quality means nothing here.

Writes ``benchmarks/results/frameworks_local.json`` (status, wall time, sessions
ingested, queries, errors and recall of each framework) and
``<runs>/comparison.md``/``.html``. Re-running resumes unfinished runs (each
run folder has its own checkpointer) and skips finished ones;
a run stopped with Ctrl-C or ``kill`` is recorded as ``interrupted`` and its wall
time so far is added to that of the run that resumes it (``segments`` counts them).

The results file keeps the rows of frameworks not run this time (same dataset,
limit and model), so running a few names updates only theirs; ``--report``
starts nothing and reports every run as it stands. It prints the README's
markdown table of all rows.

Run: ``python benchmarks/frameworks_local.py [--limit 20] [--frameworks a,b] [--runs runs/frameworks-local] [--report]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dualmem.config import Settings  # noqa: E402
from dualmem.datasets._validate import write_json_atomic  # noqa: E402
from dualmem.frameworks import REGISTRY  # noqa: E402
from dualmem.models.local import resolve_engine  # noqa: E402

DATA = REPO / ".." / "shared" / "data" / "realmem" / "Sophie_Dubois_dialogues_256k.json"
OUT = REPO / "benchmarks" / "results" / "frameworks_local.json"


def _dualmem() -> list[str]:
    exe = Path(sys.executable).with_name("dualmem")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dualmem.cli"]


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# the tables in the README were measured with dualmem's merged top-k pool (its default then; settings now default to dual)
RETRIEVAL_MODE = "merged"


def _engine(model: str) -> str:
    """Return the runtime that serves ``model`` (llama.cpp or transformers for local models)."""
    return resolve_engine(Settings().local_engine) if model.startswith("local:") else model.split(":", 1)[0]


def run_one(
    name: str, data: Path, limit: int, runs: Path, model: str, timeout: int, *, run: bool = True
) -> dict[str, Any]:
    """Run one framework's evaluation in a subprocess; return its status row.

    With ``run=False`` nothing is started: an unfinished run is reported as its
    status file has it (interrupted, failed), as ``incomplete`` when its folder
    exists without a status (running now, or killed hard), else as ``not run``.
    """
    run_dir = runs / name
    summary_path = run_dir / "summary.json"
    status_path = runs / f"{name}.status.json"
    row: dict[str, Any] = {"framework": name, "run_dir": os.path.relpath(run_dir, REPO)}
    if summary_path.exists() and status_path.exists():
        row = json.loads(status_path.read_text())
    elif summary_path.exists():
        row["status"] = "ok (earlier run, time not recorded)"
    elif not run:
        if status_path.exists():
            row = json.loads(status_path.read_text())
        else:  # a run folder without a status: running now, or killed before it could write one
            row["status"] = "incomplete (running or killed)" if run_dir.exists() else "not run"
    else:
        earlier = json.loads(status_path.read_text()) if status_path.exists() else {}
        earlier = earlier if earlier.get("status") == "interrupted" else {}
        cmd = [
            *_dualmem(),
            "eval",
            str(data),
            "--dataset",
            "realmem",
            "--framework",
            name,
            "--limit",
            str(limit),
            "--out",
            str(run_dir),
            "--model",
            model,
            "--set",
            f"retrieval_mode={RETRIEVAL_MODE}",
        ]
        started = time.perf_counter()
        log = runs / f"{name}.log"
        runs.mkdir(parents=True, exist_ok=True)
        row["engine"] = _engine(model)
        row["segments"] = int(earlier.get("segments", 1 if earlier else 0)) + 1
        code: int | str = "interrupted"
        try:
            with open(log, "a") as fh:
                try:
                    proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
                    code = proc.returncode
                except subprocess.TimeoutExpired:
                    code = "timeout"
        finally:  # an interrupted run resumes from its checkpoint next time; its time so far is kept
            row["wall_s"] = round(float(earlier.get("wall_s", 0.0)) + time.perf_counter() - started, 1)
            row["exit"] = code
            row["status"] = (
                "ok" if code == 0 and summary_path.exists() else ("interrupted" if code == "interrupted" else "failed")
            )
            if row["status"] == "failed":
                row["log_tail"] = log.read_text()[-2000:]
            status_path.write_text(json.dumps(row, indent=2) + "\n")
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        records = _records(run_dir)
        row["queries"] = len(records)
        row["answered"] = sum(1 for r in records if (r.get("answer") or "").strip())
        row["queries_with_errors"] = summary.get("n_query_errors")
        row["ingest"] = summary.get("ingest")
        overall = summary.get("overall") or {}
        row["metrics"] = {k: v for k, v in overall.items() if isinstance(v, int | float) and k.endswith("@10")}
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every framework (or those named), print a status table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="RealMem file (default: Sophie_Dubois)")
    parser.add_argument(
        "--limit", type=int, default=20, help="first N queries (replay stops at the N-th query's session)"
    )
    parser.add_argument("--frameworks", default=",".join(REGISTRY), help="comma-separated names (default: all)")
    parser.add_argument(
        "--runs", type=Path, default=REPO / "runs" / "frameworks-local", help="folder of the run folders"
    )
    parser.add_argument("--model", default="local:smollm2", help="chat model of every framework")
    parser.add_argument("--timeout", type=int, default=4 * 3600, help="seconds allowed per framework")
    parser.add_argument("--out", type=Path, default=OUT, help="JSON file written with the results")
    parser.add_argument("--report", action="store_true", help="start nothing: report the runs as they stand")
    args = parser.parse_args(argv)
    if not args.data.exists():
        raise SystemExit(f"RealMem data not found at {args.data}; pass --data (see ../shared/data/README.md)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops like Ctrl-C: the run's time so far is recorded
    names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    rows = []
    for name in names:
        print(f"[{datetime.now(UTC):%H:%M:%S}] {name} ...", flush=True)
        try:
            row = run_one(name, args.data, args.limit, args.runs, args.model, args.timeout, run=not args.report)
        except KeyboardInterrupt:  # Ctrl-C or kill: the run wrote its status; record it and stop without a traceback
            rows.append(run_one(name, args.data, args.limit, args.runs, args.model, args.timeout, run=False))
            _write(args, rows)
            print(f"  interrupted: {name} resumes from its checkpoint when this command is run again", flush=True)
            raise SystemExit(130) from None
        print(
            f"  {row['status']}  {row.get('wall_s', '-')} s  queries={row.get('queries')}  {row.get('metrics')}",
            flush=True,
        )
        rows.append(row)
        if not args.report:  # after each run, so a later interrupt keeps the finished ones
            _write(args, rows)
    results = _write(args, rows)
    print(markdown_table(results["frameworks"]))
    done = [str(args.runs / r["framework"]) for r in results["frameworks"] if r["status"].startswith("ok")]
    if done:
        subprocess.run([*_dualmem(), "eval", "compare", *done, "--out", str(args.runs)], check=False)
    return results


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Return the README's table of ``rows``: status, engine, wall time, ingest and answers per framework."""
    lines = [
        "| framework | status | engine | wall time | sessions ingested | items written | failed chunks | queries answered "
        "| recall_any@10 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ingest = r.get("ingest") or {}
        wall = f"{r['wall_s'] / 60:.0f} min" if r.get("wall_s") is not None else "-"
        answered = f"{r['answered']}/{r['queries']}" if "queries" in r else "-"
        recall = (r.get("metrics") or {}).get("recall_any@10")
        lines.append(
            f"| `{r['framework']}` | {r['status']} | {r.get('engine', '-')} | {wall} | {ingest.get('sessions', '-')} "
            f"| {ingest.get('items_written', '-')} | {ingest.get('failed_chunks', '-')} | {answered} "
            f"| {'-' if recall is None else round(recall, 2)} |"
        )
    return "\n".join(lines)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _merged(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return ``rows`` plus the rows of ``out`` (same dataset, limit and model) for frameworks not in ``rows``.

    A run of some frameworks keeps the others' figures in the results file; rows come in registry order.
    """
    earlier = json.loads(out.read_text()) if out.exists() else {}
    kept = (
        {r["framework"]: r for r in earlier.get("frameworks", [])}
        if all(earlier.get(k) == v for k, v in meta.items())
        else {}
    )
    kept.update({r["framework"]: r for r in rows})
    order = list(REGISTRY)
    return sorted(kept.values(), key=lambda r: order.index(r["framework"]) if r["framework"] in order else len(order))


def _write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    meta = {"dataset": str(args.data.name), "limit": args.limit, "model": args.model}
    results = {
        "benchmark": "every framework through `dualmem eval` on the bundled local model",
        **meta,
        "frameworks": _merged(args.out, meta, rows),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(f"wrote {write_json_atomic(args.out, results)}")
    return results


if __name__ == "__main__":
    main()
