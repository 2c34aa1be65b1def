"""The one search of memory rows: which rows a ``filter`` keeps, and how the kept rows rank for a query.

Both store backends and retrieval's RAM snapshots search with these functions and nothing else (a backend only
selects the rows of a namespace, kind and status, as arrow columns), so the same rows and query give the same
list, with the same scores, on every path.

**Filters** (:func:`allowed`): a ``filter`` dict over the :data:`~dualmem.stores.contract.FILTERABLE` fields —
plain values mean equality, operator dicts use ``$eq $ne $gt $gte $lt $lte $in``, several keys are ANDed — and a
``since``/``until`` window of ``event_time`` (ISO text, bounds included). A NULL passes no comparison and no bound
(``{"$eq": None}`` asks for NULL, ``{"$ne": None}`` for not NULL); a text field never equals a number. A bad
filter raises (:func:`check_filter`), with the same error on every path, whether or not the namespace holds rows.

**Ranking** (:func:`search`) over a :class:`Corpus` (the rows' keys, unit vectors and texts) and the rows allowed:

- ``vector``: cosine of the unit query vector with the stored (unit, float16-rounded) vectors;
- ``fts``: DualMem's BM25 (:mod:`dualmem.lexical`) with the statistics of the allowed rows only; a row scoring 0
  is no hit;
- ``hybrid``: reciprocal-rank fusion (:func:`rrf`) of the best ``max(2k, 20)`` rows of each.

Scores equal to ``TIE_DECIMALS`` decimals are ties, broken by the smaller key (``pk``): float noise (summation
order, SIMD, the order a backend read its rows in) never orders two rows, so a result is a pure function of the
rows and the query.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dualmem.errors import ConfigurationError
from dualmem.lexical import TermMatrix, query_terms
from dualmem.stores.contract import FILTERABLE
from dualmem.vectors import dots

TIE_DECIMALS = 6  # scores equal to this many decimals are ties: float noise (summation order, SIMD) never orders them
RRF_K = 60
_OPS = {
    "$eq": pc.equal,
    "$ne": pc.not_equal,
    "$gt": pc.greater,
    "$gte": pc.greater_equal,
    "$lt": pc.less,
    "$lte": pc.less_equal,
}


# --------------------------------------------------------------------------- filters


def check_filter(filt: Mapping[str, Any] | None) -> None:
    """Raise on a filter naming a field outside :data:`FILTERABLE` or an unknown operator (``ConfigurationError``),
    or holding a value that is not a string, finite number or boolean (``ValueError``)."""
    for key, wanted in (filt or {}).items():
        if key not in FILTERABLE:
            raise ConfigurationError(f"cannot filter on {key!r}; filterable fields are {sorted(FILTERABLE)}")
        for op, arg in (wanted if isinstance(wanted, Mapping) else {"$eq": wanted}).items():
            if op == "$in":
                if not isinstance(arg, list | tuple | set):
                    raise ConfigurationError(f"filter {key!r}: $in takes a list, got {type(arg).__name__}")
                for value in arg:
                    _check_value(value)
            elif op in _OPS:
                if arg is not None:
                    _check_value(arg)
            else:
                raise ConfigurationError(f"filter {key!r}: unknown operator {op!r}; use one of {[*_OPS, '$in']}")


def _check_value(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"filter value {value!r} is not a finite number")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("a NUL character cannot be stored or searched; remove it from the value")
    if not isinstance(value, str | int | float):  # a bool is an int
        raise ValueError(f"filter value {value!r} must be a string, number or boolean")


def allowed(
    rows: pa.Table, filt: Mapping[str, Any] | None = None, since: str | None = None, until: str | None = None
) -> np.ndarray | None:
    """Return which ``rows`` pass ``filt`` and the ``event_time`` window (None: no filter and no window, every row).

    ``rows`` holds the columns the filter names (``event_time`` for a window); the filter is checked first.
    """
    check_filter(filt)
    if not filt and not (since or until):
        return None
    keep = pa.array(np.ones(rows.num_rows, dtype=bool))
    for key, wanted in (filt or {}).items():
        column = rows.column(FILTERABLE[key])
        for op, arg in (wanted if isinstance(wanted, Mapping) else {"$eq": wanted}).items():
            if op == "$in":
                test = pc.is_in(column, value_set=pa.array([v for v in arg if isinstance(v, str)], pa.string()))
                test = pc.and_(test, pc.is_valid(column))
            elif arg is None:
                test = pc.is_valid(column) if op == "$ne" else pc.is_null(column)
            elif not isinstance(arg, str):
                test = pa.array(np.zeros(rows.num_rows, dtype=bool))  # a text column never equals a number
            else:
                test = _OPS[op](column, arg)
            keep = pc.and_(keep, test).fill_null(False)
    for bound, compare in ((since, pc.greater_equal), (until, pc.less_equal)):
        if bound:
            keep = pc.and_(keep, compare(rows.column("event_time"), bound)).fill_null(False)
    return keep.to_numpy(zero_copy_only=False)


# --------------------------------------------------------------------------- ranking


@dataclass
class Corpus:
    """What ranking reads of candidate rows: their keys (``pk``), unit vectors (None: no cosine wanted) and texts.

    The term matrix of the texts is built the first time BM25 needs it, and kept with the corpus.
    """

    keys: np.ndarray
    vectors: np.ndarray | None
    texts: Sequence[str | None]
    _terms: TermMatrix | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    def terms(self) -> TermMatrix:
        """Return the term matrix of the texts (built once)."""
        if self._terms is None:
            self._terms = TermMatrix.build([t or "" for t in self.texts])
        return self._terms


def top(scores: np.ndarray, rows: np.ndarray, keys: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Return ``(row, score)`` of the ``k`` best ``rows`` (``scores[i]`` is ``rows[i]``'s; higher first; equal to
    ``TIE_DECIMALS``: smaller key)."""
    if k <= 0 or not len(rows):
        return []
    rounded = np.round(scores, TIE_DECIMALS)
    if len(rows) > k:  # only the rows at or above the k-th score can be in the top k (ties at the edge included)
        edge = np.partition(rounded, len(rows) - k)[len(rows) - k]
        near = np.flatnonzero(rounded >= edge)
        rows, scores, rounded = rows[near], scores[near], rounded[near]
    order = np.lexsort((keys[rows], -rounded))[:k]
    return [(int(rows[i]), float(scores[i])) for i in order]


def cosine_top(corpus: Corpus, vector: Any, k: int, rows: np.ndarray) -> list[tuple[int, float]]:
    """Return the ``k`` of ``rows`` nearest ``vector`` by cosine."""
    if not len(rows):
        return []
    assert corpus.vectors is not None, "a cosine ranking needs the rows' vectors"
    q = np.asarray(vector, dtype=np.float32)
    q = q / (float(np.linalg.norm(q)) or 1.0)
    return top(dots(corpus.vectors, q)[rows], rows, corpus.keys, k)


def bm25_top(corpus: Corpus, query: str, k: int, rows: np.ndarray) -> list[tuple[int, float]]:
    """Return the ``k`` of ``rows`` best matching ``query`` by BM25 over ``rows`` (those scoring above 0)."""
    terms = query_terms(query)
    if not len(terms) or not len(rows):
        return []
    scores = corpus.terms().bm25(terms, rows)
    hit = scores > 0
    return top(scores[hit], rows[hit], corpus.keys, k)


def rrf(rankings: Sequence[Sequence[tuple[str, Any]]], k: int) -> list[tuple[str, float]]:
    """Fuse ranked ``(key, anything)`` lists by reciprocal rank, ``sum 1 / (60 + rank)``; ties by key."""
    fused: dict[str, float] = {}
    for ranked in rankings:
        for rank, (key, _) in enumerate(ranked, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def search(
    corpus: Corpus, query: str, vector: Any, k: int, mode: str = "hybrid", mask: np.ndarray | None = None
) -> list[tuple[int, float]]:
    """Return ``(row, score)`` of the ``k`` best rows of ``corpus`` allowed by ``mask`` (None: all) for ``mode``:
    cosine (``vector``), BM25 (``fts``) or their reciprocal-rank fusion (``hybrid``)."""
    rows = np.arange(len(corpus)) if mask is None else np.flatnonzero(mask)
    if mode == "vector":
        return cosine_top(corpus, vector, k, rows)
    if mode == "fts":
        return bm25_top(corpus, query, k, rows)
    fetch = max(2 * k, 20)
    rankings = [
        [(str(corpus.keys[r]), r) for r, _ in cosine_top(corpus, vector, fetch, rows)],
        [(str(corpus.keys[r]), r) for r, _ in bm25_top(corpus, query, fetch, rows)],
    ]
    row_of = {key: r for ranking in rankings for key, r in ranking}
    return [(row_of[key], score) for key, score in rrf(rankings, k)]
