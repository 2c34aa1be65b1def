"""Pure metric functions of every protocol: RoleMemo, RealMem, LoCoMo and ragas ID-based.

Everything here is deterministic and side-effect free; embeddings are passed
in (an ``Embeddings`` object or a callable ``texts -> vectors``) so reports
can name the similarity embedder used.

>>> realmem_session_metrics(["s2", "s1", "s2"], ["s1"], ks=(5,))["ndcg_any@5"]
1.0
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

FACT_THRESHOLD = 0.60
INSIGHT_THRESHOLD = 0.65
REALMEM_KS = (5, 10, 20)

Embedder = Any  # langchain Embeddings or Callable[[list[str]], list[list[float]]]


# --------------------------------------------------------------------------- helpers


def dedup(items: Iterable[str]) -> list[str]:
    """Return ``items`` without repeats, keeping the first occurrence."""
    seen: set[str] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def embed_texts(embed: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Return L2-normalised vectors of ``texts`` (rows), from an embedder or a callable."""
    if not texts:
        return np.zeros((0, 1))
    fn: Callable[[list[str]], Any] = embed.embed_documents if hasattr(embed, "embed_documents") else embed
    vecs = np.asarray(fn(list(texts)), dtype=float)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return vecs / norms


def similarity_matrix(gold: Sequence[str], candidates: Sequence[str], embed: Embedder) -> np.ndarray:
    """Return the cosine similarities of each gold text (rows) with each candidate (columns)."""
    if not gold or not candidates:
        return np.zeros((len(gold), len(candidates)))
    both = embed_texts(embed, [*gold, *candidates])
    return both[: len(gold)] @ both[len(gold) :].T


def best_similarities(gold: Sequence[str], candidates: Sequence[str], embed: Embedder) -> list[float]:
    """Return, for each gold text, its best cosine similarity among ``candidates`` (0 if none)."""
    if not gold:
        return []
    if not candidates:
        return [0.0] * len(gold)
    return [float(x) for x in similarity_matrix(gold, candidates, embed).max(axis=1)]


def mean(values: Iterable[float | None]) -> float:
    """Return the mean of the finite values (NaN when there are none)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else float("nan")


# --------------------------------------------------------------------------- RoleMemo


def rolememo_recall(
    gold_facts: Sequence[str],
    gold_insight: str | None,
    retrieved_texts: Sequence[str],
    embed: Embedder,
    k: int = 10,
    fact_threshold: float = FACT_THRESHOLD,
    insight_threshold: float = INSIGHT_THRESHOLD,
) -> dict[str, Any]:
    """Score one query: best similarity of each gold item among the top-``k`` retrieved texts.

    ``retrieved_texts`` are both streams merged in rank order, grounding
    expansion excluded. Returns per-item similarities and hits, and counts for
    micro-averaging (:func:`aggregate_rolememo`), and per retrieved text the
    gold items it matches (``retrieved_matches``: "fact 1", "insight").
    """
    top = list(retrieved_texts)[:k]
    golds = [*gold_facts, *([gold_insight] if gold_insight else [])]
    matrix = similarity_matrix(golds, top, embed)
    sims = [float(x) for x in matrix.max(axis=1)] if top else [0.0] * len(golds)
    fact_sims = sims[: len(gold_facts)]
    labels = [f"fact {i + 1}" for i in range(len(gold_facts))] + (["insight"] if gold_insight else [])
    limits = [fact_threshold] * len(gold_facts) + ([insight_threshold] if gold_insight else [])
    matches = [
        [lab for g, (lab, lim) in enumerate(zip(labels, limits, strict=True)) if matrix[g, j] >= lim]
        for j in range(len(top))
    ]
    insight_sim = sims[len(gold_facts)] if gold_insight else None
    fact_hits = [s >= fact_threshold for s in fact_sims]
    return {
        "fact_similarities": fact_sims,
        "fact_hits": fact_hits,
        "fact_total": len(fact_hits),
        "fact_hit_count": sum(fact_hits),
        "insight_similarity": insight_sim,
        "insight_hit": None if insight_sim is None else insight_sim >= insight_threshold,
        "insight_total": 0 if insight_sim is None else 1,
        "insight_hit_count": int(insight_sim is not None and insight_sim >= insight_threshold),
        "fact_recall": sum(fact_hits) / len(fact_hits) if fact_hits else float("nan"),
        "insight_recall": float("nan") if insight_sim is None else float(insight_sim >= insight_threshold),
        "retrieved_matches": matches,
    }


def _micro(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    ft = sum(r["fact_total"] for r in rows)
    it = sum(r["insight_total"] for r in rows)
    return {
        "fact_recall@10": sum(r["fact_hit_count"] for r in rows) / ft if ft else float("nan"),
        "insight_recall@10": sum(r["insight_hit_count"] for r in rows) / it if it else float("nan"),
        "n_queries": float(len(rows)),
        "n_gold_facts": float(ft),
        "n_gold_insights": float(it),
    }


def aggregate_rolememo(
    records: Sequence[Mapping[str, Any]], task_types: Sequence[str | None] | None = None
) -> dict[str, Any]:
    """Micro-average :func:`rolememo_recall` results over gold items: overall and per task type.

    ``task_types`` gives each record's type (else ``record["task_type"]``).
    """
    types = list(task_types) if task_types is not None else [r.get("task_type") for r in records]
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec, tt in zip(records, types, strict=True):
        groups[tt or "unknown"].append(rec)
    return {"overall": _micro(records), "by_task_type": {tt: _micro(rows) for tt, rows in sorted(groups.items())}}


# --------------------------------------------------------------------------- RealMem


def dcg(relevances: Sequence[float], k: int) -> float:
    """Return DCG@k as RealMem computes it: rel_1 + sum_{i>=2} rel_i / log2(i)."""
    rel = list(relevances)[:k]
    if not rel:
        return 0.0
    return float(rel[0] + sum(r / math.log2(i) for i, r in enumerate(rel[1:], start=2)))


def realmem_session_metrics(
    ranked_session_ids: Sequence[str], gold_session_ids: Sequence[str], ks: Sequence[int] = REALMEM_KS
) -> dict[str, float]:
    """Return recall_any@k, recall_all@k and ndcg_any@k of one query over session ids.

    The ranked list is deduplicated (first occurrence kept); IDCG uses the gold
    set. A query without gold sessions returns ``{}`` (RealMem skips it).
    """
    gold = set(gold_session_ids)
    if not gold:
        return {}
    ranked = dedup(ranked_session_ids)
    out: dict[str, float] = {}
    for k in ks:
        top = ranked[:k]
        rel = [1.0 if s in gold else 0.0 for s in top]
        ideal = dcg([1.0] * len(gold), k)
        out[f"recall_any@{k}"] = float(any(s in gold for s in top))
        out[f"recall_all@{k}"] = float(gold <= set(top))
        out[f"ndcg_any@{k}"] = dcg(rel, k) / ideal if ideal else 0.0
    return out


def average_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Return the mean of each key over ``rows`` (NaN and missing values ignored)."""
    keys = dedup(k for row in rows for k in row)
    return {k: mean(row.get(k) for row in rows) for k in keys}


def macro_average(per_persona: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Return the unweighted mean over personas of each metric."""
    return average_metrics(list(per_persona.values()))


def memory_point_recall(
    gold_points: Sequence[str], candidate_texts: Sequence[str], embed: Embedder, threshold: float = FACT_THRESHOLD
) -> dict[str, Any]:
    """Return the share of gold memory points matched (cosine >= ``threshold``) by a candidate text."""
    sims = best_similarities(gold_points, candidate_texts, embed)
    hits = [s >= threshold for s in sims]
    return {
        "memory_point_recall": sum(hits) / len(hits) if hits else float("nan"),
        "memory_point_similarities": sims,
        "memory_point_hits": hits,
    }


# --------------------------------------------------------------------------- LoCoMo


def locomo_evidence_recall(retrieved_turn_ids: Sequence[str], gold_turn_ids: Sequence[str], k: int) -> float:
    """Return the share of gold dialogue ids (``D1:3``) among the top-``k`` retrieved ids (NaN if no gold)."""
    gold = set(gold_turn_ids)
    if not gold:
        return float("nan")
    top = set(dedup(retrieved_turn_ids)[:k])
    return len(gold & top) / len(gold)


def aggregate_by(
    records: Sequence[Mapping[str, Any]], key: str, metric_keys: Sequence[str] | None = None
) -> dict[str, dict[str, float]]:
    """Average each record's ``metrics`` grouped by ``record[key]`` (e.g. LoCoMo category)."""
    groups: dict[str, list[Mapping[str, float]]] = defaultdict(list)
    for rec in records:
        metrics = rec.get("metrics", {})
        if metric_keys is not None:
            metrics = {k: v for k, v in metrics.items() if k in metric_keys}
        groups[str(rec.get(key))].append(metrics)
    return {g: average_metrics(rows) for g, rows in sorted(groups.items())}


# --------------------------------------------------------------------------- ragas ID-based


def id_context_recall(retrieved_ids: Sequence[str], reference_ids: Sequence[str]) -> float:
    """Return ragas IDBasedContextRecall: |reference ∩ retrieved| / |reference| (NaN if no reference)."""
    ref = {str(x) for x in reference_ids}
    if not ref:
        return float("nan")
    got = {str(x) for x in retrieved_ids}
    return len(ref & got) / len(ref)


def id_context_precision(retrieved_ids: Sequence[str], reference_ids: Sequence[str]) -> float:
    """Return ragas IDBasedContextPrecision: |retrieved ∩ reference| / |retrieved| (NaN if none retrieved)."""
    got = {str(x) for x in retrieved_ids}
    if not got:
        return float("nan")
    ref = {str(x) for x in reference_ids}
    return len(got & ref) / len(got)


def ragas_id_scores(retrieved_ids: Sequence[str], reference_ids: Sequence[str]) -> dict[str, float]:
    """Return ragas' ID-based context recall and precision of one query (its definitions, computed here).

    Runs use this fast pure version per query; :func:`ragas_id_scores_batch`
    recomputes the same runs with ragas itself (``run_eval`` stores both and
    a test checks they agree).
    """
    return {
        "id_context_recall": id_context_recall(retrieved_ids, reference_ids),
        "id_context_precision": id_context_precision(retrieved_ids, reference_ids),
    }


# langchain-community 0.4 removed these modules; ragas 0.3.9 imports them at
# package import but never uses them for the ID-based metrics.
_REMOVED_MODULES = {
    "langchain_community.chat_models.vertexai": "ChatVertexAI",
    "langchain_community.llms.vertexai": "VertexAI",
}


def _shim_removed_modules() -> None:
    import importlib
    import sys
    import types

    for name, cls in _REMOVED_MODULES.items():
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            setattr(module, cls, type(cls, (), {"__doc__": "placeholder: removed from langchain-community"}))
            sys.modules[name] = module


def load_ragas_id_metrics() -> tuple[Any, Any, Any] | None:
    """Return ragas' (SingleTurnSample, IDBasedContextRecall(), IDBasedContextPrecision()), or None if it cannot import."""
    import os

    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")  # ragas sends usage analytics unless told not to
    _shim_removed_modules()
    try:
        from ragas import SingleTurnSample
        from ragas.metrics import IDBasedContextPrecision, IDBasedContextRecall
    except Exception:  # noqa: BLE001 - any import failure means ragas is unavailable
        return None
    return SingleTurnSample, IDBasedContextRecall(), IDBasedContextPrecision()


def ragas_available() -> bool:
    """Return True when ragas' ID-based metrics import offline in this environment."""
    return load_ragas_id_metrics() is not None


def ragas_id_scores_batch(pairs: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[dict[str, float]] | None:
    """Score ``(retrieved_ids, reference_ids)`` pairs with ragas itself; None when ragas is unavailable."""
    loaded = load_ragas_id_metrics()
    if loaded is None:
        return None
    import asyncio

    sample_cls, recall, precision = loaded

    async def score_all() -> list[dict[str, float]]:
        out = []
        for retrieved, reference in pairs:
            sample = sample_cls(
                retrieved_context_ids=[str(x) for x in retrieved], reference_context_ids=[str(x) for x in reference]
            )
            out.append(
                {
                    "id_context_recall": float(await recall.single_turn_ascore(sample)) if reference else float("nan"),
                    "id_context_precision": float(await precision.single_turn_ascore(sample))
                    if retrieved
                    else float("nan"),
                }
            )
        return out

    return asyncio.run(score_all())
