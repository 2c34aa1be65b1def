"""How the dual store searches one table: the in-RAM namespace view, LanceDB's prefiltered scan, full text, RRF.

A namespace of up to ``flat_search_max_rows`` active items is searched exactly
on its RAM view (``_vcache``), brought up to the table's latest version on
every read; a larger one (or a process told not to hold views) uses LanceDB's
prefiltered scan, through the IVF index once one is built and the namespace
is too large to scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import dualmem.stores._lance as L
import dualmem.stores._vcache as _vcache
from dualmem.stores._rows import ITEM_COLUMNS
from dualmem.stores._sql import Scope, ns_eq_sql, ns_key, rrf_fuse

RRF_K = 60


@dataclass(frozen=True)
class Snapshot:
    """A namespace's active items of one kind at one table version, as held in RAM (``DualStore.snapshot``).

    ``rows`` has the item columns (no vectors), ``vectors`` their unit-normalised float32 rows,
    ``allowed`` marks the rows inside the caller's filter (None: all), and ``derived`` is where
    readers keep what they compute from exactly these rows (shared until the namespace changes).
    """

    kind: str
    version: int
    rows: pa.Table
    vectors: np.ndarray
    allowed: np.ndarray | None
    derived: dict[str, Any]


class TableSearch:
    """Vector, full-text and hybrid search of one facts or insights table."""

    def __init__(self, kind: str, table: Any, cache: _vcache.VectorCache, dims: int, flat_search_max_rows: int, fts_reindex_rows: int) -> None:
        self.kind, self.table, self.cache, self.dims = kind, table, cache, dims
        self.flat_search_max_rows, self.fts_reindex_rows = flat_search_max_rows, fts_reindex_rows
        self._checked: dict[str, int] = {}  # what -> table version at the last check
        self._unit = L.unit_vectors(table)
        self._vector_index = False

    def _once_per_version(self, what: str) -> bool:
        version = self.table.version
        if self._checked.get(what) == version:
            return False
        self._checked[what] = version
        return True

    def rows(self, query: str, vector: Any, k: int, mode: str, scope: Scope) -> list[tuple[dict[str, Any], float]]:
        """Return the ``k`` best rows of ``scope`` with their scores (cosine, BM25 or RRF by ``mode``)."""
        if mode == "vector":
            return [(r, 1.0 - r.pop("_distance")) for r in self.vector_rows(vector, k, scope)]
        self.refresh_fts()
        if mode == "fts":
            return [(r, float(r.pop("_score"))) for r in self.fts_rows(query, k, scope.sql())]
        fetch = max(2 * k, 20)
        return rrf_fuse([self.vector_rows(vector, fetch, scope), self.fts_rows(query, fetch, scope.sql())], k, RRF_K)

    def view(self, scope: Scope) -> _vcache.Entry | None:
        """Return the namespace's RAM view at the table's latest version (None: not held)."""
        if scope.status != "active" or self.flat_search_max_rows <= 0:
            return None
        key = (self.kind, ns_key(scope.namespace))
        version = self.table.version  # the latest commit of any process
        entry = self.cache.peek(key)
        if entry is None or entry.version != version:
            args = (self.table, Scope(scope.namespace, "active").sql(), ITEM_COLUMNS, self.dims, self.flat_search_max_rows, version)
            entry = _vcache.load(*args) if entry is None else _vcache.refresh(entry, *args, ns=key[1])
            self.cache.put(key, entry)
        return entry if entry.matrix is not None else None

    def snapshot(self, scope: Scope) -> Snapshot | None:
        """Return the scope's rows from the namespace's RAM view (None: the namespace is too large to hold)."""
        entry = self.view(scope)
        if entry is None or entry.rows is None or entry.matrix is None:
            return None
        return Snapshot(self.kind, entry.version, entry.rows, entry.matrix, self.mask(entry, scope), entry.derived)

    def mask(self, entry: _vcache.Entry, scope: Scope) -> np.ndarray | None:
        """Return which rows of ``entry`` are in ``scope`` (None: all); a structured filter is resolved by LanceDB."""
        ids = {r["id"] for r in L.query_rows(self.table, scope.sql(), ["id"])} if scope.filter else None
        return entry.mask(since=scope.since, until=scope.until, ids=ids)

    def vector_rows(self, vector: Any, k: int, scope: Scope, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """Return the ``k`` nearest rows of ``scope`` (with ``_distance`` = 1 - cosine)."""
        columns = columns or ITEM_COLUMNS
        entry = self.view(scope)
        if entry is not None:  # exact search in RAM
            return entry.top(np.asarray(vector, dtype=np.float32), k, self.mask(entry, scope), columns)
        if self._once_per_version("vector-index"):
            self._vector_index = L.has_index(self.table, "vector")
        exact = not self._vector_index or self.table.count_rows(ns_eq_sql(scope.namespace)) <= max(self.flat_search_max_rows, 50_000)
        probes, refine = (None, None) if exact else (32, 5)  # a small namespace is cheaper to scan exactly
        return L.nearest(self.table, vector, k, scope.sql(), columns, exact=exact, nprobes=probes, refine_factor=refine,
                         unit=self._unit).to_pylist()

    def fts_rows(self, query: str, k: int, filt: str | None) -> list[dict[str, Any]]:
        """Return the ``k`` best full-text rows matching ``filt`` (with ``_score``)."""
        if not query.strip():
            return []
        return L.text_search(self.table, query, k, filt, ITEM_COLUMNS).to_pylist()

    def refresh_fts(self) -> None:
        """Fold rows into the full-text index once enough are unindexed (checked when the table changed)."""
        if not self._once_per_version("fts"):
            return
        if not L.has_index(self.table, "text"):
            L.ensure_indexes(self.table, L.base_index_configs({"text": "FTS"}))
        elif L.unindexed_rows(self.table, "text") >= self.fts_reindex_rows:
            L.optimize(self.table)
