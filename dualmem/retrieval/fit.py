"""Fit the ranker's weights on labelled queries against a store — the same features the product ranks with.

1. :func:`collect` runs the pipeline's candidate and feature steps
   (:meth:`~dualmem.retrieval.pipeline.Ranker.prepare`) for each
   :class:`Example`: a query, its conversation context, what the store showed
   when it was asked (``filter``: e.g. only the sessions before it), and its
   relevant item ids or sessions;
2. :func:`fit` learns one weight per feature with a listwise loss: a softmax
   over each query's candidates, ``-log`` of the probability mass on its
   relevant items (any of them will do), plus an L2 penalty;
3. ``RankerWeights.save(path)`` writes a file that ``ranker=PATH`` (a setting)
   ranks with.

Each collected query keeps its ``group`` (a persona, a conversation): fit on
some groups and score the others with the saved weights to get held-out
figures (``benchmarks/realmem_retrieval.py``, ``benchmarks/locomo_retrieval.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize

from dualmem.retrieval.features import FEATURES, features
from dualmem.retrieval.pipeline import KINDS, Ranker
from dualmem.retrieval.weights import RankerWeights
from dualmem.schema import MemoryKind
from dualmem.stores.dual import DualStore, Namespace


@dataclass
class Example:
    """One labelled query: relevant item ids and/or sessions, its context, and what was visible (``filter``)."""

    namespace: Namespace
    query: str
    relevant_ids: Collection[str] = ()
    relevant_sessions: Collection[str] = ()
    context: Sequence[Any] | None = None
    filter: Mapping[str, Any] | None = None
    group: str = ""
    id: str = ""


@dataclass
class Collected:
    """One query's feature matrix and labels (which candidates are relevant)."""

    group: str
    id: str
    x: np.ndarray
    y: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)


def collect(
    store: DualStore,
    examples: Iterable[Example],
    *,
    kinds: Sequence[MemoryKind] = KINDS,
    ranker: Ranker | None = None,
    progress: str | None = None,
) -> list[Collected]:
    """Return the feature matrix and labels of each example (examples without a visible relevant item are kept, unlabeled)."""
    ranker = ranker or Ranker()
    items = list(examples)
    iterator: Iterable[Example] = items
    if progress is not None:
        from tqdm import tqdm

        iterator = tqdm(items, desc=progress, unit="query")
    out = []
    for ex in iterator:
        prepared = ranker.prepare(store, ex.namespace, ex.query, context=ex.context, kinds=kinds, filter=ex.filter)
        if prepared is None:
            raise ValueError(f"namespace {ex.namespace} is too large to hold in RAM; fit on a smaller one")
        cands, q = prepared
        ids, sessions = set(ex.relevant_ids), set(ex.relevant_sessions)
        y = np.fromiter((i in ids or cands.session_ids[s] in sessions for i, s in zip(cands.ids, cands.session, strict=True)),
                        dtype=bool, count=len(cands))
        out.append(Collected(ex.group, ex.id, features(cands, q).astype(np.float32), y))
    return out


def _loss(w: np.ndarray, x: np.ndarray, y: np.ndarray, starts: np.ndarray, group: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
    s = x @ w
    s -= np.maximum.reduceat(s, starts)[group]
    e = np.exp(s)
    p = e / np.add.reduceat(e, starts)[group]
    mass = np.maximum(np.add.reduceat(p * y, starts), 1e-300)
    n = len(starts)
    grad = x.T @ (p - y * p / mass[group]) / n + 2.0 * l2 * w
    return float(-np.log(mass).sum() / n + l2 * w @ w), grad


def fit(
    collected: Sequence[Collected],
    *,
    l2: float = 1e-3,
    max_per_session: int = 0,
    exclude_groups: Collection[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> RankerWeights:
    """Return weights fitted on ``collected`` queries (those of ``exclude_groups`` left out) by the listwise loss."""
    used = [c for c in collected if c.group not in exclude_groups and c.y.any() and not c.y.all()]
    if not used:
        raise ValueError("no query to fit on: each needs at least one relevant and one other candidate")
    x = np.concatenate([c.x for c in used]).astype(np.float64)
    y = np.concatenate([c.y for c in used]).astype(np.float64)
    sizes = np.asarray([len(c.y) for c in used])
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    group = np.repeat(np.arange(len(used)), sizes)
    start = np.zeros(len(FEATURES))
    start[FEATURES.index("dense")] = 1.0
    res = minimize(_loss, start, args=(x, y, starts, group, l2), jac=True, method="L-BFGS-B", options={"maxiter": 1000})
    groups = sorted({c.group for c in used})
    info = {"loss": "listwise softmax, -log P(relevant)", "l2": l2, "queries": len(used), "groups": groups,
            "converged": bool(res.success), **dict(meta or {})}
    return RankerWeights(FEATURES, tuple(float(v) for v in res.x), max_per_session, info)
