"""Cosine similarity and dot products: the implementations every module uses (stores search on their own views)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Return the cosine similarity of two vectors (0.0 when either is all zeros)."""
    if len(a) != len(b):
        raise ValueError(f"vectors of different sizes: {len(a)} and {len(b)}")
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def cosines(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> list[float]:
    """Return the cosine of ``query`` with each of ``vectors`` (0.0 for all-zero vectors)."""
    if not len(vectors):
        return []
    matrix = np.asarray(vectors, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    if matrix.shape[1] != q.shape[0]:
        raise ValueError(f"query has {q.shape[0]} dims but the vectors have {matrix.shape[1]}")
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(q) or 1.0)
    return [float(d / n) if n else 0.0 for d, n in zip(dots(matrix, q), norms, strict=True)]


def dots(matrix: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Return ``matrix @ other`` (``other`` one vector) or ``matrix @ other.T`` (``other`` rows), on the calling thread.

    Invariant: these products never wake BLAS worker threads. A threaded BLAS (numpy's OpenBLAS threads
    products of a few thousand rows) leaves its workers spinning after it returns, on the cores the query's
    embedder and other requests need; a ranking's product is small enough that one core does it in well under
    a millisecond. ``einsum`` (not optimised) never calls BLAS. (The figures are in the store and chat
    benchmarks' results.)
    """
    return np.einsum("ij,j->i" if other.ndim == 1 else "ij,kj->ik", matrix, other)
