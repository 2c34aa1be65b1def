"""Load test of one shared store: 1 writer process and N reader processes for a fixed time.

The writer upserts one item at a time into the queried namespace through
``LanceDualStore.upsert`` and logs each commit (id, vector seed, time it returned).
Each reader follows that log: it searches the namespace for the vector of the
newest committed item through the product's retrieval path (``Ranker("vector")``:
its RAM snapshot, which must notice the store's new version) until that item
comes back first; with nothing new, it searches for random vectors. Reported: reads/s, writes/s, read and write
latency, errors, staleness (from a commit's return to the start of the first
read that returned the item) and *stale reads* — reads that began after a
commit had returned and still missed it (the freshness contract says 0).

    python benchmarks/store_load.py --uri DIR --ns persona-5,user --seconds 60 --readers 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.embeddings import Embeddings

from dualmem.schema import Fact
from dualmem.stores import LanceDualStore


class SeedEmbeddings(Embeddings):
    """Embed "seed:N" as the N-th random unit vector (the writer and readers agree on vectors)."""

    def __init__(self, dims: int) -> None:
        self.dims = dims

    def vector(self, seed: int) -> list[float]:
        v = np.random.default_rng(seed).standard_normal(self.dims)
        return (v / np.linalg.norm(v)).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.vector(int(text.split(":")[1]) if text.startswith("seed:") else abs(hash(text)) % 10**9)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else 0.0


def writer(args: argparse.Namespace) -> dict[str, Any]:
    store = LanceDualStore(args.uri, SeedEmbeddings(args.dims), dims=args.dims)
    ns, end, n, laps, errors = tuple(args.ns.split(",")), time.time() + args.seconds, 0, [], 0
    with open(args.log, "a", buffering=1) as log:
        while time.time() < end:
            seed = 10**8 + os.getpid() * 10**4 + n
            t0 = time.perf_counter()
            try:
                store.upsert([Fact(id=f"load-{seed}", namespace=ns, text=f"seed:{seed}")])
            except Exception:  # noqa: BLE001 - counted
                errors += 1
                continue
            laps.append((time.perf_counter() - t0) * 1000)
            log.write(json.dumps({"id": f"load-{seed}", "seed": seed, "t": time.time()}) + "\n")
            n += 1
    return {"writes": n, "errors": errors, "write_p50_ms": _pct(laps, 0.5), "write_p95_ms": _pct(laps, 0.95)}


def reader(args: argparse.Namespace) -> dict[str, Any]:
    from dualmem.retrieval.pipeline import Ranker

    emb = SeedEmbeddings(args.dims)
    store = LanceDualStore(args.uri, emb, dims=args.dims)
    ranker = Ranker("vector")
    ns, end, offset = tuple(args.ns.split(",")), time.time() + args.seconds, 0
    pending: list[dict[str, Any]] = []
    laps, staleness, errors, stale_reads, reads = [], [], 0, 0, 0
    rng = np.random.default_rng(os.getpid())
    while time.time() < end:
        with open(args.log) as log:  # commits that returned before this read begins
            log.seek(offset)
            chunk = log.read()
        done = chunk.rfind("\n") + 1
        offset += done
        pending += [json.loads(line) for line in chunk[:done].splitlines() if line]
        target = pending[-1] if pending else None  # the newest commit: once it shows, the older ones did too
        query = f"seed:{target['seed']}" if target else f"seed:{int(rng.integers(0, 10**6))}"
        started = time.time()
        t0 = time.perf_counter()
        try:
            hits = [(h.item.id, h.score) for h in ranker.rank(store, ns, query, args.k, kinds=("fact",))]
        except Exception:  # noqa: BLE001 - counted
            errors += 1
            continue
        laps.append((time.perf_counter() - t0) * 1000)
        reads += 1
        time.sleep(args.think_ms / 1000)  # a server worker between requests; reads do not spin the CPUs
        if target:
            if hits and hits[0][0] == target["id"]:
                staleness.append((started - target["t"]) * 1000)
                pending.clear()
            else:
                stale_reads += 1
    return {"reads": reads, "errors": errors, "stale_reads": stale_reads, "laps": laps, "staleness": staleness}


def run(
    uri: str, ns: tuple[str, ...], dims: int, seconds: float, readers: int, workdir: str, think_ms: float = 5.0
) -> dict[str, Any]:
    """Start 1 writer and ``readers`` reader processes on ``uri``; return the merged figures."""
    log = Path(workdir) / f"commits-{time.time_ns()}.jsonl"
    log.touch()
    base = [
        sys.executable,
        __file__,
        "--uri",
        uri,
        "--ns",
        ",".join(ns),
        "--dims",
        str(dims),
        "--seconds",
        str(seconds),
        "--log",
        str(log),
        "--think-ms",
        str(think_ms),
    ]
    procs = [subprocess.Popen([*base, "--role", "reader"], stdout=subprocess.PIPE, text=True) for _ in range(readers)]
    time.sleep(2.0)  # readers open the store (and load the namespace view) before the first write
    procs.append(subprocess.Popen([*base, "--role", "writer"], stdout=subprocess.PIPE, text=True))
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    w, rs = outs[-1], outs[:-1]
    laps = [x for r in rs for x in r["laps"]]
    stale = [x for r in rs for x in r["staleness"]]
    return {
        "seconds": seconds,
        "writer_processes": 1,
        "reader_processes": readers,
        "reader_think_ms": think_ms,
        "writes_per_s": round(w["writes"] / seconds, 1),
        "reads_per_s": round(sum(r["reads"] for r in rs) / seconds, 1),
        "read_p50_ms": _pct(laps, 0.5),
        "read_p95_ms": _pct(laps, 0.95),
        "write_p50_ms": w["write_p50_ms"],
        "write_p95_ms": w["write_p95_ms"],
        "errors": w["errors"] + sum(r["errors"] for r in rs),
        "stale_reads": sum(r["stale_reads"] for r in rs),
        "commits_seen": len(stale),
        "staleness_p50_ms": _pct(stale, 0.5),
        "staleness_p95_ms": _pct(stale, 0.95),
        "staleness_max_ms": round(max(stale), 2) if stale else 0.0,
        "staleness_mean_ms": round(statistics.fmean(stale), 2) if stale else 0.0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uri", required=True)
    p.add_argument("--ns", required=True, help="namespace parts, comma-separated")
    p.add_argument("--dims", type=int, default=384)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--think-ms", type=float, default=5.0, help="pause of a reader between its searches")
    p.add_argument("--log", help="commit log (set by the driver for its workers)")
    p.add_argument("--role", choices=["writer", "reader"], help="internal: run one worker")
    args = p.parse_args()
    if args.role == "writer":
        print(json.dumps(writer(args)))
    elif args.role == "reader":
        print(json.dumps(reader(args)))
    else:
        figures = run(
            args.uri,
            tuple(args.ns.split(",")),
            args.dims,
            args.seconds,
            args.readers,
            str(Path(args.uri).parent),
            args.think_ms,
        )
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
