"""How the dual store searches one table: the in-RAM namespace view, LanceDB's prefiltered scan, full text, RRF.

A namespace of up to ``flat_search_max_rows`` active items is searched exactly
on its RAM view (``_vcache``), brought up to the table's latest version on
every read; a larger one (or a process told not to hold views) uses LanceDB's
prefiltered scan, through the IVF index once one is built and the namespace
is too large to scan.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import dualmem.stores._lance as L
import dualmem.stores._vcache as _vcache
from dualmem.stores._rows import ITEM_COLUMNS, unit_vectors
from dualmem.stores._sql import Scope, ns_eq_sql, ns_key, row_key, rrf_fuse, sql_in

RRF_K = 60
FTS_CHECK_VERSIONS = 16


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


def sorted_page(views: list[pa.Table], limit: int | None, newest_first: bool) -> list[dict[str, Any]]:
    """Return rows of ``views`` ordered by (created_at, updated_at, id), newest first or oldest first, ``limit`` of them."""
    table = pa.concat_tables(views) if len(views) > 1 else views[0]
    order = "descending" if newest_first else "ascending"
    index = pc.sort_indices(table, sort_keys=[(c, order) for c in ("created_at", "updated_at", "id")])
    return table.take(index if limit is None else index[: max(0, limit)]).to_pylist()


class TableSearch:
    """Vector, full-text and hybrid search of one facts or insights table."""

    def __init__(self, kind: str, table: Any, cache: _vcache.VectorCache, dims: int, flat_search_max_rows: int, fts_reindex_rows: int) -> None:
        self.kind, self.table, self.cache, self.dims = kind, table, cache, dims
        self.flat_search_max_rows, self.fts_reindex_rows = flat_search_max_rows, fts_reindex_rows
        self._checked: dict[str, int] = {}  # what -> table version at the last check
        self._unit = unit_vectors(table)
        self._vector_index = False
        self._pin = threading.local()  # this thread's pinned table version (see pinned)

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Read the table's latest version once for the reads of this block in this thread (nested blocks share it).

        Each read of the version is a round trip to LanceDB's event loop thread; a reader
        making several reads in a row (the writer's view: two searches and two listings per
        stream) needs one. Commits in the block are not seen by its later reads.
        """
        depth = getattr(self._pin, "depth", 0)
        self._pin.depth = depth + 1
        try:
            yield
        finally:
            self._pin.depth = depth
            if depth == 0:
                self._pin.version = None

    def version(self) -> int:
        """Return the table's latest version (read once per :meth:`pinned` block)."""
        if not getattr(self._pin, "depth", 0):
            return int(self.table.version)
        if getattr(self._pin, "version", None) is None:
            self._pin.version = int(self.table.version)
        return int(self._pin.version)

    def _once_per_version(self, what: str, every: int = 1) -> bool:
        """Return True the first time and then once the table has moved ``every`` versions on since the last True."""
        version = self.version()
        last = self._checked.get(what)
        if last is not None and last <= version < last + every:
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
        version = self.version()  # the latest commit of any process
        entry = self.cache.peek(key)
        if entry is None or entry.version != version:
            args = (self.table, Scope(scope.namespace, "active").sql(), ITEM_COLUMNS, self.dims, self.flat_search_max_rows, version)
            entry = _vcache.load(*args) if entry is None else _vcache.refresh(entry, *args, ns=key[1])
            self.cache.put(key, entry)
        return entry if entry.matrix is not None else None

    def held(self, scope: Scope) -> _vcache.Entry | None:
        """Return the namespace's RAM view, brought up to date, if this store already holds one (None: nothing loaded)."""
        if self.flat_search_max_rows <= 0 or self.cache.peek((self.kind, ns_key(scope.namespace))) is None:
            return None
        return self.view(scope)

    def rows_by_id(self, namespace: tuple[str, ...], ids: list[str], load: bool = False) -> dict[str, dict[str, Any]]:
        """Return the rows of these ids in ``namespace`` (any status): active ones from the RAM view when it is held
        (or ``load``), the rest from the table."""
        if not ids:
            return {}
        scope = Scope(namespace, "active")
        entry = self.view(scope) if load else self.held(scope)
        found: dict[str, dict[str, Any]] = {}
        if entry is not None and entry.rows is not None:
            held = [entry.index[i] for i in ids if i in entry.index]
            found = {r["id"]: r for r in entry.rows.take(pa.array(held, pa.int64())).to_pylist()} if held else {}
        if missing := [i for i in ids if i not in found]:
            found.update((r["id"], r) for r in L.query_rows(self.table, sql_in("pk", [row_key(namespace, i) for i in missing]), ITEM_COLUMNS))
        return found

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
        """Fold rows into the full-text index once enough are unindexed (checked every ``FTS_CHECK_VERSIONS`` commits:
        the check costs two index reads, and unindexed rows are searched anyway)."""
        if not self._once_per_version("fts", FTS_CHECK_VERSIONS):
            return
        if not L.has_index(self.table, "text"):
            L.ensure_indexes(self.table, L.base_index_configs({"text": "FTS"}))
        elif L.unindexed_rows(self.table, "text") >= self.fts_reindex_rows:
            L.optimize(self.table)
