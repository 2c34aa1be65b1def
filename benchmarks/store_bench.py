"""Benchmark the LanceDB dual store: search latency in one namespace inside large tables, and a load test.

For each table size, rows are spread over namespaces of ``--ns-size`` items
(interleaved row by row, as a long-running service writes them), then
``DualStore.optimize()`` gathers each namespace's rows together and indexes
them, and one namespace is queried. Every search reads with freshness on (it
checks the table's latest version first). Compared in the same run over the
same vectors:

- ``lance vector``   DualStore.search_vectors (ids + scores) on the in-RAM namespace view
- ``lance vector+items`` DualStore.search(mode="vector"), items parsed
- ``lance hybrid``   DualStore.search(mode="hybrid"): vector + full text, RRF
- ``lance time-filtered`` DualStore.search(mode="vector", since=...) (~half the namespace), items parsed
- ``lance filter-dict`` search_vectors(filter={"event_time": {"$gte": ...}}), resolved by LanceDB
- ``lance vector after another writer's commit`` the first search after another store wrote the
  namespace: the view notices the new version and fetches only the changed rows
- ``lance vector after own upsert`` the first search after this store wrote the namespace (view patched)
- ``lance fresh worker`` a store that holds no RAM view (a fresh server worker): LanceDB's own
  prefiltered scan of the namespace (bitmap index on ``namespace``)
- ``numpy``          brute force: the namespace's float32 vectors already in RAM, matmul + top-k
- ``numpy filtered`` same with the time mask
- ``inmemory``       LangGraph InMemoryStore.search(query=...) (and with a filter dict)

Then, on the largest table, ``benchmarks/store_load.py``: 1 writer and
``--readers`` reader processes on the same store for ``--load-seconds``.

Vectors are random unit vectors; texts are 12 random English words (from the
bundled tokenizer's vocabulary) so the full-text index has real terms.
InMemoryStore is filled through its documented ``_data``/``_vectors`` dicts;
vectors of namespaces that are not queried share a small pool of lists to
keep memory bounded (its search only reads the queried namespace).

    python benchmarks/store_bench.py --sizes 100000,1000000 --ns-size 10000 --dims 384 --queries 200 --load-seconds 60
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from langchain_core.embeddings import Embeddings
from rich.console import Console
from rich.progress import track
from rich.table import Table

from dualmem.schema import Fact
from dualmem.stores import LanceDualStore
from dualmem.stores._rows import item_schema
from dualmem.stores._sql import ns_key, row_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_load  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "store_bench.json"
BATCH = 50_000
BLAS_THREADS_VAR = "OPENBLAS_NUM_THREADS"
console = Console()


class LookupEmbeddings(Embeddings):
    """Return precomputed vectors for known texts (queries of the benchmark)."""

    def __init__(self, table: dict[str, list[float]], dims: int) -> None:
        self.table, self.dims = table, dims

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed several texts."""
        return [self.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed one text."""
        return self.table.get(text) or [0.0] * self.dims


def vocabulary() -> list[str]:
    """Return real English words (the bundled WordPiece vocabulary, whole alphabetic words)."""
    try:
        from dualmem.local.bundled import bundled_embedder_path

        vocab = (bundled_embedder_path() / "vocab.txt").read_text().split()
        words = [w for w in vocab if w.isalpha() and w.isascii() and len(w) >= 4]
        if len(words) > 2000:
            return words
    except Exception:  # noqa: BLE001 - fall back to a synthetic vocabulary
        pass
    rng = np.random.default_rng(7)
    return ["".join(rng.choice(list("aeioubcdfghklmnprstvw"), 6)) for _ in range(20_000)]


def unit(rng: np.random.Generator, n: int, dims: int) -> np.ndarray:
    """Return ``n`` random unit vectors (float32)."""
    v = rng.standard_normal((n, dims), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def timed(fn: Callable[[Any], Any], args: list[Any], prep: Callable[[Any], Any] | None = None) -> dict[str, float]:
    """Run ``fn`` on each arg (after 3 warm-ups; ``prep(arg)`` first, untimed); return p50/p95/mean in ms."""
    for a in args[:3]:
        fn(a)
    laps = []
    for a in args:
        if prep is not None:
            prep(a)
        t0 = time.perf_counter()
        fn(a)
        laps.append((time.perf_counter() - t0) * 1000)
    return _stats(laps)


def timed_interleaved(fns: dict[str, Callable[[Any], Any]], args: list[Any]) -> dict[str, dict[str, float]]:
    """Time several methods query by query, in turn; return their p50/p95/mean latency in ms."""
    for a in args[:3]:
        for fn in fns.values():
            fn(a)
    laps: dict[str, list[float]] = {name: [] for name in fns}
    for a in args:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(a)
            laps[name].append((time.perf_counter() - t0) * 1000)
    return {name: _stats(v) for name, v in laps.items()}


def _stats(laps: list[float]) -> dict[str, float]:
    laps = sorted(laps)
    return {
        "p50_ms": round(statistics.median(laps), 3),
        "p95_ms": round(laps[min(len(laps) - 1, int(0.95 * len(laps)))], 3),
        "mean_ms": round(statistics.fmean(laps), 3),
        "n": len(laps),
    }


def dir_size(path: str) -> int:
    """Return the bytes under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def load_table(store: LanceDualStore, total: int, ns_size: int, dims: int, target: int, words: list[str], seed: int):
    """Bulk-load ``total`` facts interleaved over namespaces; return the target namespace's data and timing."""
    rng = np.random.default_rng(seed)
    n_ns = max(1, total // ns_size)
    table = store._tables["fact"]
    schema = item_schema(dims)
    t_vecs, t_ids, t_times, t_texts = [], [], [], []
    start = time.perf_counter()
    now = datetime.now(UTC)
    vocab = np.asarray(words)
    for lo in track(range(0, total, BATCH), description=f"load {total:,} rows", console=console):
        n = min(BATCH, total - lo)
        idx = np.arange(lo, lo + n)
        ns_idx = idx % n_ns
        vecs = unit(rng, n, dims)
        texts = [" ".join(r) for r in vocab[rng.integers(0, len(vocab), (n, 12))]]
        days = rng.integers(0, 730, n)
        times = [f"{2023 + d // 365}-{1 + (d % 365) // 31:02d}-{1 + d % 28:02d}" for d in days]
        ids = [f"f{i}" for i in idx]
        ns_keys = [ns_key((f"persona-{j}", "user")) for j in ns_idx]
        cols = {
            "pk": [row_key((f"persona-{j}", "user"), i) for j, i in zip(ns_idx, ids, strict=True)],
            "id": ids,
            "namespace": ns_keys,
            "kind": ["fact"] * n,
            "text": texts,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1).astype(np.float16)), dims),
            "session_id": [f"s{i // 50}" for i in idx],
            "turn_ids": [[f"t{i}"] for i in idx],
            "chunk_id": [None] * n,
            "event_time": times,
            "created_at": [now] * n,
            "updated_at": [now] * n,
            "grounding": [[] for _ in range(n)],
            "emotion": [None] * n,
            "status": ["active"] * n,
            "meta": ["{}"] * n,
        }
        table.add(pa.table({k: cols[k] for k in schema.names}, schema=schema))
        mask = ns_idx == target
        t_vecs.append(vecs[mask])
        t_ids += [ids[i] for i in np.flatnonzero(mask)]
        t_times += [times[i] for i in np.flatnonzero(mask)]
        t_texts += [texts[i] for i in np.flatnonzero(mask)]
    load_s = time.perf_counter() - start
    t0 = time.perf_counter()
    gathered = store.optimize()  # gather each namespace's rows, fold everything into the indexes
    index_s = time.perf_counter() - t0
    console.print(f"optimize: gathered {gathered['fact']} namespaces and indexed in {index_s:.1f} s")
    return np.concatenate(t_vecs), t_ids, t_times, t_texts, load_s, index_s, n_ns


def bench_size(args: argparse.Namespace, total: int, words: list[str], load_seconds: float = 0) -> dict[str, Any]:
    """Run every measurement for one table size."""
    dims, k = args.dims, 10
    root = tempfile.mkdtemp(prefix=f"store-bench-{total}-", dir=args.workdir)
    uri = str(Path(root) / "db")
    rng = np.random.default_rng(1000 + total)
    q_vecs = unit(rng, args.queries, dims)
    q_texts = [" ".join(rng.choice(words, 3)) for _ in range(args.queries)]
    lookup = LookupEmbeddings({t: v.tolist() for t, v in zip(q_texts, q_vecs, strict=True)}, dims)
    min_rows = 1 if args.vector_index else 10**12
    store = LanceDualStore(uri, lookup, dims=dims, vector_index_min_rows=min_rows)
    n_ns = max(1, total // args.ns_size)
    target = n_ns // 2
    ns = (f"persona-{target}", "user")
    vecs, ids, times, texts, load_s, index_s, n_ns = load_table(
        store, total, args.ns_size, dims, target, words, seed=total
    )
    out: dict[str, Any] = {
        "rows": total,
        "namespaces": n_ns,
        "ns_items": len(ids),
        "bulk_insert_rows_per_s": round(total / load_s),
        "optimize_s": round(index_s, 2),
        "disk_bytes": dir_size(uri),
    }
    # upsert path (merge_insert by key, precomputed vectors): 2,000 items in batches of 200
    up_vecs = unit(rng, 2000, dims)
    items = [Fact(id=f"u{i}", namespace=ns, text=" ".join(rng.choice(words, 12))) for i in range(2000)]
    t0 = time.perf_counter()
    for lo in range(0, 2000, 200):
        store.upsert(items[lo : lo + 200], vectors=up_vecs[lo : lo + 200].tolist())
    out["upsert_items_per_s"] = round(2000 / (time.perf_counter() - t0))
    store.delete(ns, [it.id for it in items])
    store.optimize()

    qs = list(range(args.queries))
    late = np.asarray([t >= "2024-01-01" for t in times])  # the same rows as since="2024-01-01"
    where = {"event_time": {"$gte": "2024-01-01"}}
    lat: dict[str, dict[str, float]] = {}
    console.print(f"[bold]{total:,} rows[/]: querying namespace {ns} ({len(ids):,} items)")
    since = "2024-01-01"

    def brute(i: int, mat: np.ndarray = vecs) -> np.ndarray:
        scores = mat @ q_vecs[i]
        top = np.argpartition(-scores, k)[:k]
        return top[np.argsort(-scores[top])]

    late_vecs = vecs[late]
    # interleaved: every query runs each method in turn, so bursts of load on a shared machine
    # hit all of them alike instead of whichever happened to be measured at the time
    lat.update(
        timed_interleaved(
            {
                "lance vector": lambda i: store.search_vectors(ns, q_vecs[i], k=k),
                "numpy": brute,
                "lance vector+items": lambda i: store.search(
                    ns, q_texts[i], kind="fact", k=k, mode="vector", vector=q_vecs[i]
                ),
                "lance time-filtered": lambda i: store.search(
                    ns, q_texts[i], kind="fact", k=k, mode="vector", vector=q_vecs[i], since=since
                ),
                "numpy filtered": lambda i: brute(i, late_vecs),
                "lance hybrid": lambda i: store.search(
                    ns, q_texts[i], kind="fact", k=k, mode="hybrid", vector=q_vecs[i]
                ),
                "lance fts": lambda i: store.search(ns, q_texts[i], kind="fact", k=k, mode="fts"),
                "lance filter-dict": lambda i: store.search_vectors(ns, q_vecs[i], k=k, filter=where),
            },
            qs,
        )
    )
    few = qs[: args.cold_queries]
    other = LanceDualStore(uri, lookup, dims=dims, vector_index_min_rows=min_rows)  # another writer (own view)
    foreign = unit(rng, len(qs), dims)

    def foreign_write(i: int) -> None:
        other.upsert([Fact(id=f"o{i}", namespace=ns, text=" ".join(rng.choice(words, 12)))], [foreign[i].tolist()])

    lat["lance vector after another writer's commit"] = timed(
        lambda i: store.search_vectors(ns, q_vecs[i], k=k), few, prep=foreign_write
    )
    fresh = LanceDualStore(uri, lookup, dims=dims, vector_index_min_rows=min_rows, flat_search_max_rows=0)
    lat["lance fresh worker (no RAM view, prefiltered scan)"] = timed(lambda i: fresh.search_vectors(ns, q_vecs[i], k=k), qs[:100])

    # recall of the store against exact brute force
    hits = 0
    for i in qs[:50]:
        exact = {ids[j] for j in brute(i)}
        hits += len(exact & {h for h, _ in store.search_vectors(ns, q_vecs[i], k=k)})
    out["lance_recall_at_10"] = round(hits / (10 * min(50, len(qs))), 4)
    fresh_vecs = unit(rng, len(few), dims)

    def own_write(i: int) -> None:  # a write through this store patches its RAM cache in place
        store.upsert([Fact(id=f"w{i}", namespace=ns, text=" ".join(rng.choice(words, 12)))], [fresh_vecs[i].tolist()])

    lat["lance vector after own upsert"] = timed(
        lambda i: store.search_vectors(ns, q_vecs[i], k=k), few, prep=own_write
    )

    mem_q = qs[: args.inmemory_queries]
    lat.update(bench_inmemory(total, n_ns, target, ids, vecs, times, texts, lookup, q_texts, mem_q, dims))
    out["latency"] = lat
    out["ratio_lance_vector_to_numpy_p50"] = round(lat["lance vector"]["p50_ms"] / lat["numpy"]["p50_ms"], 2)
    out["speedup_vs_inmemory_p50"] = round(lat["inmemory"]["p50_ms"] / lat["lance vector+items"]["p50_ms"], 2)
    out["fresh_worker_p50_ms"] = lat["lance fresh worker (no RAM view, prefiltered scan)"]["p50_ms"]
    if load_seconds:
        console.print(f"load test: 1 writer + {args.readers} readers for {load_seconds:.0f} s on {ns}")
        out["load_test"] = store_load.run(uri, ns, dims, load_seconds, args.readers, root)
    store = other = fresh = None  # noqa: F841 - release the tables before removing the folder
    gc.collect()
    shutil.rmtree(root, ignore_errors=True)
    return out


def bench_inmemory(total, n_ns, target, ids, vecs, times, texts, lookup, q_texts, qs, dims) -> dict[str, Any]:
    """Fill LangGraph's InMemoryStore with the same layout and time its searches."""
    from langgraph.store.base import Item
    from langgraph.store.memory import InMemoryStore

    store = InMemoryStore(index={"dims": dims, "embed": lookup, "fields": ["text"]})
    now = datetime.now(UTC)
    pool = [v.tolist() for v in unit(np.random.default_rng(5), 256, dims)]
    t0 = time.perf_counter()
    for i in track(range(total), description=f"fill InMemoryStore {total:,}", console=console):
        j = i % n_ns
        if j == target:
            continue
        ns = (f"persona-{j}", "user")
        store._data[ns][f"f{i}"] = Item(
            value={"text": "", "half": "h1"}, key=f"f{i}", namespace=ns, created_at=now, updated_at=now
        )
        store._vectors[ns][f"f{i}"] = {"text": pool[i % 256]}
    ns = (f"persona-{target}", "user")
    for key, vec, t, text in zip(ids, vecs, times, texts, strict=True):
        half = "h2" if t >= "2024-01-01" else "h1"
        store._data[ns][key] = Item(
            value={"text": text, "half": half}, key=key, namespace=ns, created_at=now, updated_at=now
        )
        store._vectors[ns][key] = {"text": vec.tolist()}
    fill_s = time.perf_counter() - t0
    res = {
        "inmemory": timed(lambda i: store.search(ns, query=q_texts[i], limit=10), qs),
        "inmemory filtered": timed(lambda i: store.search(ns, query=q_texts[i], limit=10, filter={"half": "h2"}), qs),
    }
    res["inmemory"]["fill_s"] = round(fill_s, 1)
    store = None  # noqa: F841
    gc.collect()
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write benchmarks/results/store_bench.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100000,1000000", help="comma-separated table sizes (rows)")
    p.add_argument("--ns-size", type=int, default=10_000, help="items per namespace")
    p.add_argument("--dims", type=int, default=384, help="vector dimensions")
    p.add_argument("--queries", type=int, default=200, help="queries per measurement")
    p.add_argument("--inmemory-queries", type=int, default=50, help="queries for InMemoryStore (slow)")
    p.add_argument("--cold-queries", type=int, default=20, help="queries measured right after another writer's commit")
    p.add_argument("--load-seconds", type=float, default=60, help="load test on the largest table (0: none)")
    p.add_argument("--readers", type=int, default=4, help="reader processes of the load test")
    p.add_argument("--vector-index", action="store_true", help="also build the IVF_PQ vector index")
    p.add_argument("--workdir", default=None, help="where the temporary LanceDB folders go")
    p.add_argument("--out", default=str(RESULTS), help="JSON results file")
    args = p.parse_args(argv)
    if BLAS_THREADS_VAR not in os.environ and argv is None:
        # one BLAS thread for numpy (the baseline and the store's in-RAM search alike): on a shared,
        # oversubscribed machine multi-threaded OpenBLAS gemv has tail latencies of tens of ms
        env = {**os.environ, BLAS_THREADS_VAR: "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    words = vocabulary()
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "blas_threads": os.environ.get(BLAS_THREADS_VAR),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")},
        "targets": {
            "lance_vs_numpy_p50_max": 1.5, "speedup_vs_inmemory_at_1M_min": 10, "fresh_worker_p50_ms_max": 10,
            "load_test_errors": 0, "load_test_staleness_p95_ms_max": 100,
        },
        "runs": [],
    }
    runs = report["runs"]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    for size in sizes:
        runs.append(bench_size(args, size, words, args.load_seconds if size == max(sizes) else 0))
        runs[-1]["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")  # after every size: partial results survive
    for run in runs:
        t = Table(title=f"{run['rows']:,} rows, namespace of {run['ns_items']:,} items ({args.dims} dims)")
        for col in ("search", "p50 ms", "p95 ms"):
            t.add_column(col)
        for name, m in run["latency"].items():
            t.add_row(name, f"{m['p50_ms']:.2f}", f"{m['p95_ms']:.2f}")
        console.print(t)
        console.print(
            f"bulk insert {run['bulk_insert_rows_per_s']:,} rows/s, upsert {run['upsert_items_per_s']:,} items/s, "
            f"optimize {run['optimize_s']} s, disk {run['disk_bytes'] / 2**20:.0f} MiB, "
            f"recall@10 {run['lance_recall_at_10']}, lance/numpy {run['ratio_lance_vector_to_numpy_p50']}x, "
            f"speedup vs InMemoryStore {run['speedup_vs_inmemory_p50']}x, fresh worker p50 {run['fresh_worker_p50_ms']} ms"
        )
        if "load_test" in run:
            console.print({"load test": run["load_test"]})
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
