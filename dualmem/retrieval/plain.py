"""Plain searches over a RAM snapshot: cosine, BM25, and both fused by reciprocal rank — deterministic.

What the ``vector``, ``fts`` and ``hybrid`` rankers and the writer's working view
rank with. Scores are computed on the snapshot's rows only (BM25 statistics are
those of the rows searched), and ties go to the smaller key, so the same store
contents and query give the same list every time, in any process, on either
backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualmem.lexical import TermMatrix, bm25, query_terms
from dualmem.retrieval.snapshot import Snapshot
from dualmem.stores.contract import rrf

TERMS_KEY = "dualmem.retrieval.plain:terms"


TIE_DECIMALS = 6  # scores equal to this many decimals are ties: float noise (summation order, SIMD) never orders them


def _top(scores: np.ndarray, keys: np.ndarray, rows: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Return ``(row, score)`` of the ``k`` best ``rows`` (higher score first; equal to ``TIE_DECIMALS``: smaller key)."""
    if k <= 0 or not len(rows):
        return []
    rounded = np.round(scores[rows], TIE_DECIMALS)
    if len(rows) > k:  # only the rows at or above the k-th score can be in the top k (ties at the edge included)
        edge = np.partition(rounded, len(rows) - k)[len(rows) - k]
        near = np.flatnonzero(rounded >= edge)
        rows, rounded = rows[near], rounded[near]
    order = np.lexsort((keys[rows], -rounded))[:k]
    return [(int(rows[i]), float(scores[rows[i]])) for i in order]


def keys_of(snap: Snapshot) -> np.ndarray:
    """Return the rows' keys (``pk``) as an array (computed once per snapshot)."""
    keys = snap.derived.get("pk")
    if keys is None:
        keys = snap.derived["pk"] = np.asarray(snap.rows.column("pk").to_pylist(), dtype=object)
    return keys


def cosine_top(snap: Snapshot, vector: Any, k: int, mask: np.ndarray | None = None) -> list[tuple[int, float]]:
    """Return the ``k`` rows nearest ``vector`` by cosine (``mask``: the rows allowed)."""
    q = np.asarray(vector, dtype=np.float32)
    q = q / (float(np.linalg.norm(q)) or 1.0)
    scores = snap.vectors @ q if len(snap) else np.zeros(0, dtype=np.float32)
    rows = np.flatnonzero(mask) if mask is not None else np.arange(len(snap))
    return _top(scores, keys_of(snap), rows, k)


def bm25_top(snap: Snapshot, query: str, k: int, mask: np.ndarray | None = None) -> list[tuple[int, float]]:
    """Return the ``k`` rows best matching ``query`` by BM25 over the allowed rows (those with a score above 0)."""
    terms = query_terms(query)
    rows = np.flatnonzero(mask) if mask is not None else np.arange(len(snap))
    if not len(terms) or not len(rows):
        return []
    matrix = snap.derived.get(TERMS_KEY)
    if matrix is None:
        matrix = snap.derived[TERMS_KEY] = TermMatrix.build([t or "" for t in snap.rows.column("text").to_pylist()])
    scores = np.zeros(len(snap))
    scores[rows] = bm25(matrix.counts(terms)[rows], matrix.lengths[rows])
    return _top(scores, keys_of(snap), rows[scores[rows] > 0], k)


def search(
    snap: Snapshot, query: str, vector: Any, k: int, mode: str = "hybrid", mask: np.ndarray | None = None
) -> list[tuple[int, float]]:
    """Return ``(row, score)`` of the ``k`` best rows for ``mode`` (``vector``, ``fts`` or ``hybrid``)."""
    if mode == "vector":
        return cosine_top(snap, vector, k, mask)
    if mode == "fts":
        return bm25_top(snap, query, k, mask)
    fetch = max(2 * k, 20)
    keys = keys_of(snap)
    rankings = [
        [(str(keys[r]), r) for r, _ in cosine_top(snap, vector, fetch, mask)],
        [(str(keys[r]), r) for r, _ in bm25_top(snap, query, fetch, mask)],
    ]
    row_of = {key: r for ranking in rankings for key, r in ranking}
    return [(row_of[key], score) for key, score in rrf(rankings, k)]
