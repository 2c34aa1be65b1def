"""Plain searches over a RAM snapshot: cosine, BM25, and both fused by reciprocal rank — deterministic.

What the ``vector``, ``fts`` and ``hybrid`` rankers and the writer's working view rank with: the one ranker of
:mod:`~dualmem.stores.ranking`, which the stores' own searches run too, over the snapshot's rows. BM25 statistics
are those of the rows searched and ties go to the smaller key, so the same store contents and query give the same
list every time, in any process, on either backend, through the store's search or a snapshot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualmem.retrieval.snapshot import Snapshot
from dualmem.stores import ranking

CORPUS_KEY = "dualmem.retrieval.plain:corpus"


def corpus(snap: Snapshot) -> ranking.Corpus:
    """Return the snapshot's rows as the ranker reads them (built once per snapshot, kept in ``derived``)."""
    found = snap.derived.get(CORPUS_KEY)
    if found is None:
        keys = np.asarray(snap.rows.column("pk").to_pylist(), dtype=object)
        found = snap.derived[CORPUS_KEY] = ranking.Corpus(keys, snap.vectors, snap.rows.column("text").to_pylist())
    return found


def cosine_top(snap: Snapshot, vector: Any, k: int, mask: np.ndarray | None = None) -> list[tuple[int, float]]:
    """Return ``(row, cosine)`` of the ``k`` rows nearest ``vector`` (``mask``: the rows allowed)."""
    return search(snap, "", vector, k, "vector", mask)


def search(
    snap: Snapshot, query: str, vector: Any, k: int, mode: str = "hybrid", mask: np.ndarray | None = None
) -> list[tuple[int, float]]:
    """Return ``(row, score)`` of the ``k`` best rows for ``mode`` (``vector``, ``fts`` or ``hybrid``)."""
    return ranking.search(corpus(snap), query, vector, k, mode, mask)
