"""`dualmem eval` at scale: many small personas against an endpoint that answers after 2 s, in-process and on Ray.

A loopback OpenAI-compatible stand-in (``tests/fixtures/standin.py``, in a
process of its own, as a real endpoint is) answers every call after
``--latency`` seconds (default 2 s); the writer's answer is a memory update of
a few hundred tokens (three facts and two insights quoting the chunk). The
personas are copies of the bundled RoleMemo sample (four sessions, the first
``--limit`` queries kept), evaluated with the dualmem framework as ``dualmem
eval -d rolememo DIR -f dualmem --limit 1`` does (``run_evals``, answers on,
no judge), the store a local folder every node of the cluster shares.

Each run is a fresh driver process (its peak memory is its own) with
``endpoint_concurrency`` = the limit (16, 64) and twice as many units in
flight (``concurrency``): in-process (threads of the driver), and on a local
Ray cluster of a head (the driver's, no CPU for workers) and two worker nodes
of one CPU each (``ray.cluster_utils.Cluster``, started once). Per run:

- calls, wall time, calls/s; ``utilisation`` = calls × latency / (wall × limit);
- the harness's own CPU-seconds per model call (the driver's, plus the Ray
  workers' for a cluster run; the endpoint's and Ray's daemons' not counted);
- ``bound_fraction`` = calls/s ÷ min(limit / latency, cores / CPU-s per call),
  ``cores`` the machine's; and, as the machine is shared, the same against the
  cores left to the run (``bound_fraction_of_free_cores``: the machine's
  cores less what other processes kept busy during the run: Ray's daemons,
  other users; the endpoint's own CPU is reported apart);
- the gate's peak of calls in flight (cluster runs) and the endpoint's;
- the driver's peak RSS, also as personas grow (``--grow``, default 200 → 800).

    python benchmarks/eval_scale.py      # prints the figures, writes benchmarks/results/eval_scale.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
TARGET_UTILISATION = 0.8
TARGET_BOUND = 0.8


def writer_script(name: str | None, schema: dict[str, Any] | None, messages: list[dict[str, Any]]) -> Any:
    """Answer as the stand-in does, the writer with three facts and two insights quoting the chunk (a few hundred tokens)."""
    from fixtures.standin import default_script

    answer = default_script(name, schema, messages)
    if name != "MemoryUpdate":
        return answer
    chunk = " ".join(str(m.get("content") or "") for m in messages[-1:]).split()
    words = [w for w in chunk if w.isalpha()] or ["nothing"]
    line = lambda start: " ".join(words[start % len(words) :][:45] or words[:45])  # noqa: E731
    return {
        "facts": [
            {"op": "ADD", "id": f"N{i}", "text": f"User said: {line(i * 45)}", "turn_ids": []} for i in (1, 2, 3)
        ],
        "insights": [
            {"op": "ADD", "id": f"M{i}", "text": f"I read this as telling: {line(i * 30)}", "fact_ids": ["N1", "N2"]}
            for i in (1, 2)
        ],
    }


def _serve(conn: Any, latency: float) -> None:
    """Child process: serve the stand-in until told to stop, then send back its call log."""
    from fixtures.standin import OpenAIStandin

    with OpenAIStandin(latency_s=latency, script=writer_script) as server:
        conn.send(server.base_url)
        conn.recv()
        conn.send([{"start": c["start"], "end": c["end"], "schema": c["schema"]} for c in server.calls])


def make_data(folder: Path, personas: int) -> Path:
    """Write ``personas`` copies of the bundled RoleMemo sample (ids p0000…) into ``folder``."""
    from dualmem.datasets import dump_rolememo, load_sample
    from dualmem.schema import Dataset

    base = load_sample()
    items = []
    for i in range(personas):
        item = base.model_copy(deep=True)
        item.dialogue.id = f"p{i:04d}"
        items.append(item)
    return dump_rolememo(Dataset(name="rolememo", items=items), folder)


def _peak(calls: list[dict[str, Any]]) -> int:
    edges = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    """Child process: one evaluation as a fresh driver; return its figures."""
    from dualmem.config import Settings
    from dualmem.evaluate import run_evals

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    endpoint = ctx.Process(target=_serve, args=(child, args.latency), daemon=True)
    endpoint.start()
    base_url = parent.recv()
    out = Path(args.work) / f"{args.mode}-{args.limit_calls}-{args.personas}"
    shutil.rmtree(out, ignore_errors=True)
    settings = Settings(
        chat_model="openai-compatible:standin",
        openai_base_url=base_url,
        openai_api_key="bench",
        embedder="hash:384",
        store_uri=str(out / "store"),
        checkpoint_path=str(out / "ck.sqlite"),
        concurrency=2 * args.limit_calls,
        endpoint_concurrency=args.limit_calls,
        request_timeout=60.0,
        ray_address=args.ray if args.mode == "ray" else "",
    )
    data = Path(args.work) / f"data-{args.personas}"
    busy0, cpu0, started = _busy_s(), os.times(), time.perf_counter()
    [run_dir] = run_evals(
        "rolememo",
        data,
        ["dualmem"],
        limit=1,
        out=out / "run",
        settings=settings,
        progress=False,
        ragas=False,
        upload=False,
    )
    wall = time.perf_counter() - started
    cpu1, busy1 = os.times(), _busy_s()
    parent.send("stop")
    calls = parent.recv()
    endpoint.join(30)
    cpu2 = os.times()  # the endpoint process, joined: its CPU is in the children's times
    meta = json.loads((run_dir / "summary.json").read_text())["meta"]
    summary = json.loads((run_dir / "summary.json").read_text())
    driver_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    cluster = meta.get("cluster") or {}
    worker_cpu = float(cluster.get("worker_cpu_s", 0.0))
    endpoint_cpu = (cpu2.children_user - cpu0.children_user) + (cpu2.children_system - cpu0.children_system)
    cores = os.cpu_count() or 1
    per_call = (driver_cpu + worker_cpu) / max(1, len(calls))
    rate = len(calls) / wall
    bound = min(args.limit_calls / args.latency, cores / per_call if per_call else float("inf"))
    others = max(0.0, (busy1 - busy0) - driver_cpu - worker_cpu - endpoint_cpu) / wall  # Ray's daemons, other users
    free = max(0.1, cores - others)
    bound_free = min(args.limit_calls / args.latency, free / per_call if per_call else float("inf"))
    return {
        "mode": args.mode,
        "personas": args.personas,
        "limit": args.limit_calls,
        "units_in_flight": settings.evaluation.concurrency,
        "calls": len(calls),
        "wall_s": round(wall, 1),
        "calls_per_s": round(rate, 2),
        "utilisation": round(len(calls) * args.latency / (wall * args.limit_calls), 3),
        "driver_cpu_s": round(driver_cpu, 1),
        "worker_cpu_s": round(worker_cpu, 1),
        "cpu_s_per_call": round(per_call, 4),
        "cores": cores,
        "bound_calls_per_s": round(bound, 2),
        "bound_fraction": round(rate / bound, 3),
        "endpoint_cpu_s": round(endpoint_cpu, 1),
        "other_busy_cores": round(others, 2),
        "bound_fraction_of_free_cores": round(rate / bound_free, 3),
        "worker_peak_rss_mb": cluster.get("worker_peak_rss_mb"),
        "endpoint_peak_in_flight": _peak(calls),
        "gate_peak_in_flight": cluster.get("peak"),
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "query_errors": summary["n_query_errors"],
        "failed_chunks": summary["ingest"]["failed_chunks"],
        "workers": meta["workers"],
    }


def _busy_s() -> float:
    """Return the CPU-seconds this machine's cores have been busy since boot (all processes, from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _child(args: argparse.Namespace, mode: str, limit: int, personas: int, address: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        "--mode",
        mode,
        "--limit-calls",
        str(limit),
        "--personas",
        str(personas),
        "--latency",
        str(args.latency),
        "--work",
        str(args.work),
        "--ray",
        address,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run {mode} limit {limit} x {personas} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run every configuration; print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--personas", type=int, default=200)
    parser.add_argument("--grow", type=int, default=800, help="personas of the memory-growth run (Ray, largest limit)")
    parser.add_argument("--limits", default="16,64", help="endpoint_concurrency values")
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument(
        "--work", type=Path, default=REPO / "runs" / "bench-scale", help="scratch folder (deleted first)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "eval_scale.json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="threads", help=argparse.SUPPRESS)
    parser.add_argument("--limit-calls", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--ray", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args)))
        return
    from ray.cluster_utils import Cluster

    shutil.rmtree(args.work, ignore_errors=True)
    for n in sorted({args.personas, args.grow}):
        make_data(args.work / f"data-{n}", n)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    limits = [int(x) for x in args.limits.split(",")]
    runs = []
    try:
        for limit in limits:
            for mode in ("threads", "ray"):
                runs.append(_child(args, mode, limit, args.personas, cluster.address))
                print(json.dumps(runs[-1]), flush=True)
        runs.append(_child(args, "ray", max(limits), args.grow, cluster.address))
        print(json.dumps(runs[-1]), flush=True)
    finally:
        cluster.shutdown()
    small = next(r for r in runs if r["mode"] == "ray" and r["limit"] == max(limits) and r["personas"] == args.personas)
    grown = runs[-1]
    result = {
        "command": f"python benchmarks/eval_scale.py --personas {args.personas} --grow {args.grow} --limits {args.limits} "
        f"--latency {args.latency}",
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "latency_s": args.latency,
        "runs": runs,
        "driver_rss_growth": {
            "personas": [args.personas, args.grow],
            "driver_peak_rss_mb": [small["driver_peak_rss_mb"], grown["driver_peak_rss_mb"]],
            "ratio": round(grown["driver_peak_rss_mb"] / small["driver_peak_rss_mb"], 3),
        },
        "targets": {"utilisation_at_16": TARGET_UTILISATION, "bound_fraction": TARGET_BOUND},
        "met": {
            "utilisation_at_16": all(r["utilisation"] >= TARGET_UTILISATION for r in runs if r["limit"] == 16),
            "bound_fraction": all(r["bound_fraction"] >= TARGET_BOUND for r in runs),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("driver_rss_growth", "met")}, indent=2))


if __name__ == "__main__":
    main()
