"""Fit the learned ranker: held-out weights per persona / conversation, and the weights shipped with dualmem.

1. Every RealMem persona and LoCoMo conversation is ingested into a
   ``raw-turns`` store (every turn as "Speaker: text", the bundled MiniLM behind
   the embedding cache) and each of its queries is turned into features exactly
   as ``dualmem eval`` asks it (:mod:`dualmem.evals.ranker_examples`: RealMem
   queries see only earlier sessions and carry their own session's turns as
   context; LoCoMo questions see everything, without context);
2. :func:`dualmem.retrieval.fit.leave_one_group_out` fits, for each persona and
   conversation, weights on all the *other* personas and conversations (each
   group weighing the same) and picks the session cap on them; they go to
   ``benchmarks/results/rankers/<id>.json`` and score that group in the
   ``held-out`` variants of ``realmem_retrieval.py`` and ``locomo_retrieval.py``;
3. the same fit on every group is written to ``dualmem/data/rankers/learned.json``:
   the default ranker (its figures on these data are in-sample).

``benchmarks/results/ranker_fit.json`` keeps the weights and, as a check, the
held-out metrics computed from the collected features (the benchmarks' figures
come from ``dualmem eval`` runs).

Run: ``python benchmarks/fit_ranker.py [--realmem DIR] [--locomo FILE] [--no-ship]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _retrieval_runs import DATA, FOLDS, RESULTS, cached_embeddings, machine

OUT = RESULTS / "ranker_fit.json"


def collect_all(realmem: Path | None, locomo: Path | None, workdir: Path, embeddings: Any) -> list[Any]:
    """Return the collected features of every query of both datasets (group = persona / conversation id)."""
    from dualmem.config import Settings
    from dualmem.datasets import load_locomo, load_realmem
    from dualmem.evals.ranker_examples import store_examples
    from dualmem.frameworks.base import FrameworkContext
    from dualmem.frameworks.raw_turns import turn_text
    from dualmem.retrieval.fit import collect
    from dualmem.retrieval.pipeline import strip_names

    items: list[tuple[str, Any]] = []
    if realmem is not None:
        items += [("realmem", load_realmem(f).items[0]) for f in sorted(realmem.glob("*.json"))]
    if locomo is not None:
        items += [("locomo", it) for it in load_locomo(locomo).items]
    texts = [turn_text(t) for _, it in items for s in it.dialogue.sessions for t in s.turns if t.text.strip()]
    texts += [
        strip_names(q.text, {t.speaker for s in it.dialogue.sessions for t in s.turns if t.speaker})
        for _, it in items
        for q in it.queries
    ]
    embeddings.cache.embed(texts, progress="embedding turns and queries")  # one batched pass; the rest hits the cache
    out = []
    for kind, item in items:
        started = time.perf_counter()
        context = FrameworkContext(
            namespace=(item.dialogue.id, "user"),
            settings=Settings(store_uri=str(workdir / kind)),
            embeddings=embeddings,
        )
        [(store, examples)] = store_examples(kind, [item], lambda _item, c=context: c)
        collected = collect(store, examples, kinds=("fact",))
        for c in collected:
            c.meta["dataset"] = kind
        out += collected
        print(
            f"{kind} {item.dialogue.id}: {len(collected)} queries ({time.perf_counter() - started:.0f} s)", flush=True
        )
    embeddings.cache.save()
    return out


def check(collected: list[Any], folds: dict[str, Any]) -> dict[str, Any]:
    """Return the held-out metrics per dataset computed from the features (a check of the eval runs)."""
    from dualmem.retrieval.fit import group_means

    means = group_means(collected, lambda g: folds[g])
    out: dict[str, Any] = {}
    for kind in ("realmem", "locomo"):
        groups = sorted({c.group for c in collected if c.meta["dataset"] == kind})
        if groups:
            keys = [k for k in means[groups[0]] if k != "n_queries"]
            out[kind] = {
                "macro": {k: round(float(np.mean([means[g][k] for g in groups])), 4) for k in keys},
                "per_group": {g: {k: round(v, 4) for k, v in means[g].items()} for g in groups},
            }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Collect, fit the folds and the shipped weights, write them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realmem", type=Path, default=DATA / "realmem", help="folder of RealMem files")
    parser.add_argument("--locomo", type=Path, default=DATA / "locomo" / "locomo10.json", help="locomo10.json")
    parser.add_argument("--folds", type=Path, default=FOLDS, help="where the held-out weights go")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-ship", action="store_true", help="do not rewrite dualmem/data/rankers/learned.json")
    args = parser.parse_args(argv)
    for path in (args.realmem, args.locomo):
        if not path.exists():
            raise SystemExit(f"{path} not found; pass --realmem / --locomo (see ../shared/data/README.md)")
    from dualmem.datasets._validate import write_json_atomic
    from dualmem.retrieval.fit import fit_with_policy, leave_one_group_out
    from dualmem.retrieval.weights import shipped_path

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dualmem-fit-") as tmp:
        collected = collect_all(args.realmem, args.locomo, Path(tmp), cached_embeddings())
    collected_s = time.perf_counter() - started
    folds = leave_one_group_out(collected)
    args.folds.mkdir(parents=True, exist_ok=True)
    for group, weights in folds.items():
        weights.save(args.folds / f"{group}.json")
    result: dict[str, Any] = {"benchmark": "ranker fit", "held_out_from_features": check(collected, folds)}
    if not args.no_ship:
        shipped = fit_with_policy(
            collected,
            meta={"fitted_on": "every RealMem persona and LoCoMo conversation (python benchmarks/fit_ranker.py)"},
        )
        shipped.save(shipped_path())
        result["shipped"] = {
            "path": "dualmem/data/rankers/learned.json",
            "max_per_session": shipped.max_per_session,
            "weights": dict(zip(shipped.features, shipped.weights, strict=True)),
        }
    result["folds"] = {
        g: {"max_per_session": w.max_per_session, "fitted_on_groups": w.meta["groups"]} for g, w in folds.items()
    }
    result["queries"] = len(collected)
    result["seconds"] = {"collect": round(collected_s), "total": round(time.perf_counter() - started)}
    result["machine"] = machine()
    write_json_atomic(args.out, result)
    for kind, block in result["held_out_from_features"].items():
        print(f"{kind} held out (from features): {block['macro']}")
    return result


if __name__ == "__main__":
    main()
