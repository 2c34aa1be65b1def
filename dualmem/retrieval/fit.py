"""Fit the ranker's weights on labelled queries against a store — the same features the product ranks with.

1. :func:`collect` runs the pipeline's candidate and feature steps
   (:meth:`~dualmem.retrieval.pipeline.Ranker.prepare`) for each
   :class:`Example`: a query, its conversation context, what the store showed
   when it was asked (``filter``: e.g. only the sessions before it), and its
   relevant item ids or sessions (:mod:`dualmem.evals.ranker_examples` builds them
   from RealMem and LoCoMo);
2. :func:`fit` learns one weight per feature with a listwise loss: a softmax
   over each query's candidates, ``-log`` of the probability mass on its
   relevant items (any of them will do), plus an L2 penalty; each group (a
   persona, a conversation) weighs the same, whatever its number of queries;
3. :func:`leave_one_group_out` fits, for each group, weights on every *other*
   group only, and picks the order policy (``max_per_session``, ``cap_after``) on those other
   groups too — the weights that score a persona or conversation never saw its
   queries; :func:`score` gives a query's protocol metric under weights;
4. ``RankerWeights.save(path)`` writes a file that ``ranker=PATH`` (a setting)
   ranks with.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize

from dualmem.retrieval.features import FEATURES, features
from dualmem.retrieval.pipeline import KINDS, Ranker, order
from dualmem.retrieval.weights import RankerWeights
from dualmem.schema import MemoryKind
from dualmem.stores.contract import DualStore, Namespace

POLICIES = (
    (0, 0),
    (1, 0),
    (2, 0),
    (1, 5),
    (1, 10),
    (2, 10),
)  # (max_per_session, cap_after) tried on the training groups
DEPTH = 20  # items retrieved per query, as `dualmem eval` retrieves for RealMem and LoCoMo
AT = 10


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
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Collected:
    """One query's feature matrix, labels (which candidates are relevant) and the candidates' session codes.

    ``unit`` is what the protocol scores: ``"session"`` (RealMem: the ranked items' sessions, NDCG over
    ``n_gold`` gold sessions) or ``"item"`` (LoCoMo: the share of the ``n_gold`` evidence turns in the top 10).
    """

    group: str
    id: str
    x: np.ndarray
    y: np.ndarray
    session: np.ndarray
    unit: str = "item"
    n_gold: int = 1
    meta: dict[str, Any] = field(default_factory=dict)


def collect(
    store: DualStore,
    examples: Iterable[Example],
    *,
    kinds: Sequence[MemoryKind] = KINDS,
    ranker: Ranker | None = None,
) -> list[Collected]:
    """Return the feature matrix and labels of each example (examples without a visible relevant item are kept, unlabeled)."""
    ranker = ranker or Ranker()
    out = []
    for ex in examples:
        prepared = ranker.prepare(store, ex.namespace, ex.query, context=ex.context, kinds=kinds, filter=ex.filter)
        if prepared is None:
            raise ValueError(f"namespace {ex.namespace} is too large to hold in RAM; fit on a smaller one")
        cands, q = prepared
        ids, sessions = set(ex.relevant_ids), set(ex.relevant_sessions)
        y = np.fromiter(
            (i in ids or cands.session_ids[s] in sessions for i, s in zip(cands.ids, cands.session, strict=True)),
            dtype=bool,
            count=len(cands),
        )
        unit = "session" if sessions and not ids else "item"
        n_gold = int(ex.meta.get("n_gold") or (len(sessions) if unit == "session" else len(ids)))
        out.append(
            Collected(
                ex.group,
                ex.id,
                features(cands, q).astype(np.float32),
                y,
                cands.session.astype(np.int32),
                unit,
                max(1, n_gold),
                dict(ex.meta),
            )
        )
    return out


def dcg(relevance: Sequence[float], k: int) -> float:
    """Return DCG@k as RealMem computes it, and :func:`dualmem.evals.metrics.dcg`: rel_1 + sum_{i>=2} rel_i / log2(i)."""
    rel = list(relevance)[:k]
    return float(rel[0] + sum(r / np.log2(i) for i, r in enumerate(rel[1:], start=2))) if rel else 0.0


def score(c: Collected, w: np.ndarray, max_per_session: int = 0, cap_after: int = 0) -> dict[str, float]:
    """Return the protocol metrics of one collected query ranked by weights ``w`` (``DEPTH`` items retrieved)."""
    picked = order(c.x @ w, c.session, DEPTH, max_per_session, cap_after) if len(c.y) else np.zeros(0, np.int64)
    if c.unit == "item":
        return {f"recall@{AT}": float(c.y[picked[:AT]].sum()) / c.n_gold}
    gold = set(c.session[c.y].tolist())
    ranked = list(dict.fromkeys(c.session[picked].tolist()))[:AT]
    rel = [1.0 if s in gold else 0.0 for s in ranked]
    return {f"ndcg_any@{AT}": dcg(rel, AT) / dcg([1.0] * c.n_gold, AT), f"recall_any@{AT}": float(any(rel))}


def group_means(collected: Sequence[Collected], weights: Callable[[str], RankerWeights]) -> dict[str, dict[str, float]]:
    """Return each group's mean metrics, its queries ranked by the weights ``weights(group)`` (and their order policy)."""
    rows: dict[str, list[dict[str, float]]] = {}
    for c in collected:
        w = weights(c.group)
        rows.setdefault(c.group, []).append(score(c, w.vector(), w.max_per_session, w.cap_after))
    return {
        g: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} | {"n_queries": float(len(rs))}
        for g, rs in rows.items()
    }


def _loss(
    w: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    offset: np.ndarray,
    starts: np.ndarray,
    group: np.ndarray,
    weight: np.ndarray,
    l2: float,
) -> tuple[float, np.ndarray]:
    s = x @ w + offset
    s -= np.maximum.reduceat(s, starts)[group]
    e = np.exp(s)
    p = e / np.add.reduceat(e, starts)[group]
    mass = np.maximum(np.add.reduceat(p * y, starts), 1e-300)
    grad = x.T @ ((p - y * p / mass[group]) * weight[group]) + 2.0 * l2 * w
    return float(-(weight * np.log(mass)).sum() + l2 * w @ w), grad


def _sampled(c: Collected, negatives: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (x, y, offset) of ``c`` with at most ``negatives`` irrelevant candidates drawn at random; each drawn
    one stands for ``n_negative / drawn`` of them (``offset`` = the log of that), so the softmax's mass is unbiased."""
    neg = np.flatnonzero(~c.y)
    if len(neg) <= negatives:
        return c.x, c.y, np.zeros(len(c.y))
    rows = np.concatenate([np.flatnonzero(c.y), np.sort(rng.choice(neg, negatives, replace=False))])
    offset = np.where(c.y[rows], 0.0, np.log(len(neg) / negatives))
    return c.x[rows], c.y[rows], offset


def fit(
    collected: Sequence[Collected],
    *,
    l2: float = 1e-3,
    max_per_session: int = 0,
    exclude_groups: Collection[str] = (),
    negatives: int = 300,
    seed: int = 0,
    meta: Mapping[str, Any] | None = None,
) -> RankerWeights:
    """Return weights fitted on ``collected`` queries (those of ``exclude_groups`` left out) by the listwise loss
    (``negatives``: irrelevant candidates sampled per query, see :func:`_sampled`)."""
    used = [c for c in collected if c.group not in exclude_groups and c.y.any() and not c.y.all()]
    if not used:
        raise ValueError("no query to fit on: each needs at least one relevant and one other candidate")
    rng = np.random.default_rng(seed)
    parts = [_sampled(c, negatives, rng) for c in used]
    x = np.concatenate([p[0] for p in parts]).astype(np.float64)
    y = np.concatenate([p[1] for p in parts]).astype(np.float64)
    offset = np.concatenate([p[2] for p in parts])
    sizes = np.asarray([len(p[1]) for p in parts])
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    index = np.repeat(np.arange(len(used)), sizes)
    groups = sorted({c.group for c in used})
    per_group = {g: sum(1 for c in used if c.group == g) for g in groups}
    weight = np.asarray([1.0 / (len(groups) * per_group[c.group]) for c in used])  # each group weighs the same
    start = np.zeros(len(FEATURES))
    start[FEATURES.index("dense")] = 1.0
    res = minimize(
        _loss,
        start,
        args=(x, y, offset, starts, index, weight, l2),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 500},
    )
    info = {
        "loss": "listwise softmax, -log P(relevant), groups weighted equally",
        "l2": l2,
        "negatives": negatives,
        "queries": len(used),
        "groups": groups,
        "converged": bool(res.success),
        **dict(meta or {}),
    }
    return RankerWeights(FEATURES, tuple(round(float(v), 6) for v in res.x), max_per_session, meta=info)


def primary(means: Mapping[str, float]) -> float:
    """Return a group's headline metric: NDCG_any@10 (session unit) or recall@10 (item unit)."""
    return float(means.get(f"ndcg_any@{AT}", means.get(f"recall@{AT}", 0.0)))


def pick_policy(
    collected: Sequence[Collected], weights: RankerWeights, policies: Sequence[tuple[int, int]] = POLICIES
) -> tuple[int, int]:
    """Return the (max_per_session, cap_after) whose mean over groups of their headline metric is best on ``collected``."""

    def value(policy: tuple[int, int]) -> float:
        trial = RankerWeights(weights.features, weights.weights, *policy)
        return float(np.mean([primary(m) for m in group_means(collected, lambda _g: trial).values()]))

    return max(policies, key=lambda p: (value(p), -p[0], -p[1]))


def fit_with_policy(
    collected: Sequence[Collected],
    *,
    l2: float = 1e-3,
    policies: Sequence[tuple[int, int]] = POLICIES,
    meta: Mapping[str, Any] | None = None,
) -> RankerWeights:
    """Return weights fitted on all of ``collected`` with the order policy that ranks them best."""
    weights = fit(collected, l2=l2, meta=meta)
    cap, after = pick_policy(collected, weights, policies)
    return RankerWeights(weights.features, weights.weights, cap, after, weights.meta)


def leave_one_group_out(
    collected: Sequence[Collected],
    *,
    l2: float = 1e-3,
    policies: Sequence[tuple[int, int]] = POLICIES,
    groups: Sequence[str] | None = None,
) -> dict[str, RankerWeights]:
    """Return, per group, weights (and order policy) fitted on the other groups' queries only."""
    out = {}
    for g in groups or sorted({c.group for c in collected}):
        others = [c for c in collected if c.group != g]
        out[g] = fit_with_policy(others, l2=l2, policies=policies, meta={"held_out": g})
    return out
