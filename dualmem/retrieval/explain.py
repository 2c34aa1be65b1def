"""Why an item ranks where it does: the learned ranker's features that add most to its score (the memory browser)."""

from __future__ import annotations

from collections.abc import Sequence

from dualmem.retrieval.features import FEATURES, features
from dualmem.retrieval.pipeline import Ranker
from dualmem.stores.contract import DualStore, Namespace


def explain(
    ranker: Ranker, store: DualStore, namespace: Namespace, query: str, ids: Sequence[str], top: int = 4
) -> dict[str, list[tuple[str, float]]]:
    """Return, per item id, the ``top`` features that add most to its learned score (weight x value), largest first.

    The same candidates and features the ranker scores with (:meth:`Ranker.prepare`); ``{}`` for a plain store search.
    """
    if ranker.weights is None or not ids:
        return {}
    prepared = ranker.prepare(store, namespace, query)
    if prepared is None:
        return {}
    cands, q = prepared
    parts = features(cands, q) * ranker.weights.vector()
    row = {i: n for n, i in enumerate(cands.ids)}
    out = {}
    for item_id in ids:
        if item_id in row:
            ranked = sorted(zip(FEATURES, parts[row[item_id]].tolist(), strict=True), key=lambda p: -abs(p[1]))
            out[item_id] = [(name, round(value, 4)) for name, value in ranked[:top]]
    return out
