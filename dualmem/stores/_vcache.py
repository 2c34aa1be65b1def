"""Per-namespace vector view: exact cosine search over a namespace's active rows in RAM.

A persona/user namespace is small (thousands of items) inside a large table;
LanceDB re-reads and decodes the vectors of a prefiltered scan on every query,
so a store keeps each searched namespace's normalised matrix in RAM (LRU,
bounded by rows) and searches it with one matrix product.

The view is a cache keyed on the table version, never the truth. Each read
checks the table's latest version (one cheap manifest check): the same version
means the view is exact; a newer one means some process committed, and the
view is brought up to date by reading the namespace's ``(id, updated_at)``
pairs and fetching only the rows that changed (deleted ones are dropped). A
write made through the store that holds the view patches it in place when no
other commit came in between (its commit is then the very next version).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import nullcontext
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from dualmem.stores._sql import and_all, sql_in

Key = tuple[str, str]  # (kind, namespace key)


@lru_cache(maxsize=1)
def _blas_controller() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: without it numpy uses its default BLAS threads
        return None
    return ThreadpoolController()


def _one_blas_thread() -> Any:
    """Return a context running BLAS on one thread.

    One product of a namespace matrix by a vector takes well under a millisecond on one
    core; multi-threaded OpenBLAS on a busy machine was measured at 25-30 ms for it.
    """
    controller = _blas_controller()
    return controller.limit(limits=1, user_api="blas") if controller is not None else nullcontext()


def _stamps(rows: pa.Table) -> np.ndarray:
    """Return the rows' ``updated_at`` as int64 microseconds (what a refresh compares)."""
    return rows.column("updated_at").cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32, copy=False)


class Entry:
    """A namespace's active rows (without vectors), their unit-normalised vectors and the table version.

    ``matrix`` is None when the namespace was too large to hold. ``derived`` holds what readers
    compute from exactly these rows (a ranker's lexical index); a changed view starts without it.
    """

    __slots__ = ("version", "ids", "matrix", "rows", "event_time", "index", "stamps", "derived")

    def __init__(self, version: int, rows: pa.Table | None = None, matrix: np.ndarray | None = None) -> None:
        self.version, self.matrix, self.rows = version, matrix, rows
        self.ids: list[str] = rows.column("id").to_pylist() if rows is not None else []
        self.index = {i: n for n, i in enumerate(self.ids)}
        has_time = rows is not None and "event_time" in rows.column_names
        times = rows.column("event_time").fill_null("").to_numpy(zero_copy_only=False) if has_time else []  # type: ignore[union-attr]
        self.event_time = np.asarray(times, dtype=str)
        self.stamps = _stamps(rows) if rows is not None else np.zeros(0, dtype=np.int64)
        self.derived: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.ids) if self.matrix is not None else 0

    def at(self, version: int) -> Entry:
        """Return the same rows, marked exact at ``version`` (a commit that did not touch them)."""
        entry = Entry.__new__(Entry)
        for name in Entry.__slots__:
            setattr(entry, name, getattr(self, name))
        entry.version = version
        return entry

    def mask(self, since: str | None = None, until: str | None = None, ids: set[str] | None = None) -> np.ndarray | None:
        """Return the boolean mask of rows inside the time window and among ``ids`` (None: all rows)."""
        if not (since or until or ids is not None):
            return None
        keep = np.ones(len(self.ids), dtype=bool)
        if since or until:
            keep &= self.event_time != ""  # SQL: a NULL event time never passes a time filter
            if since:
                keep &= self.event_time >= since
            if until:
                keep &= self.event_time <= until
        if ids is not None:
            allowed = np.zeros(len(self.ids), dtype=bool)
            allowed[[self.index[i] for i in ids if i in self.index]] = True
            keep &= allowed
        return keep

    def patched(self, version: int, drop: set[str], rows: list[dict[str, Any]] | None = None) -> Entry:
        """Return a copy at ``version`` without the ``drop`` ids, plus ``rows`` (dicts with a ``vector``; active kept)."""
        assert self.matrix is not None and self.rows is not None
        keep = np.fromiter((i not in drop for i in self.ids), dtype=bool, count=len(self.ids))
        table, matrix = self.rows.filter(pa.array(keep)), self.matrix[keep]
        added = [r for r in rows or [] if r.get("status") == "active"]
        if added:
            vecs = _normalise(np.asarray([r["vector"] for r in added], dtype=np.float32))
            extra = pa.Table.from_pylist([{c: r[c] for c in table.column_names} for r in added], schema=table.schema)
            table, matrix = pa.concat_tables([table, extra]).combine_chunks(), np.vstack([matrix, vecs])
        return Entry(version, table, np.ascontiguousarray(matrix))

    def top(self, query: np.ndarray, k: int, mask: np.ndarray | None, columns: list[str]) -> list[dict[str, Any]]:
        """Return the ``k`` nearest rows (only ``columns`` plus ``_distance`` = 1 - cosine), best first."""
        assert self.matrix is not None and self.rows is not None
        if not self.ids:
            return []
        norm = float(np.linalg.norm(query)) or 1.0
        with _one_blas_thread():
            scores = self.matrix @ (query / norm)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
            k = min(k, int(mask.sum()))
        k = min(k, len(self.ids))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k] if k < len(self.ids) else np.arange(len(self.ids))
        top = top[np.argsort(-scores[top], kind="stable")]
        if columns == ["id"]:
            picked = [{"id": self.ids[t]} for t in top.tolist()]
        else:
            picked = self.rows.select(columns).take(pa.array(top)).to_pylist()
        for row, t in zip(picked, top.tolist(), strict=True):
            row["_distance"] = 1.0 - float(scores[t])
        return picked


class VectorCache:
    """LRU of namespace views of one store, bounded by the total number of cached rows."""

    def __init__(self, max_rows: int = 500_000) -> None:
        self.max_rows = max_rows
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()

    def peek(self, key: Key) -> Entry | None:
        """Return the entry of ``key`` whatever its version (None when absent)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: Key, entry: Entry) -> None:
        """Store ``entry``, evicting least recently used namespaces beyond ``max_rows``."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._rows -= len(old)
            self._entries[key] = entry
            self._rows += len(entry)
            while self._rows > self.max_rows and len(self._entries) > 1:
                _, gone = self._entries.popitem(last=False)
                self._rows -= len(gone)

    def committed(self, kind: str, before: int, after: int, ns_key: str, drop: set[str], rows: list[dict[str, Any]]) -> None:
        """Apply this store's own commit (table version ``before`` -> ``after``) to the views it leaves exact.

        Only when ``after == before + 1`` is the commit known to be the only change: then views
        of other namespaces at ``before`` stay exact at ``after``, and the written namespace's view
        is patched. Otherwise views are left as they are (the next read brings them up to date).
        """
        if after != before + 1:
            return
        with self._lock:
            for key, entry in list(self._entries.items()):
                if key[0] != kind or entry.version != before:
                    continue
                if key[1] != ns_key:
                    self._entries[key] = entry.at(after)
                elif entry.matrix is not None:
                    new = entry.patched(after, drop, rows)
                    self._rows += len(new) - len(entry)
                    self._entries[key] = new


def load(table: Any, where: str, columns: list[str], dims: int, max_rows: int, version: int) -> Entry:
    """Read a namespace's rows and vectors from ``table`` (an entry without matrix if over ``max_rows``)."""
    data = table.search().where(where).select([*columns, "vector"]).limit(max_rows + 1).to_arrow()
    if data.num_rows > max_rows:
        return Entry(version)
    flat = data.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
    matrix = _normalise(np.asarray(flat, dtype=np.float32).reshape(data.num_rows, dims))
    return Entry(version, data.drop_columns(["vector"]).combine_chunks(), matrix)


def refresh(entry: Entry, table: Any, where: str, columns: list[str], dims: int, max_rows: int, version: int) -> Entry:
    """Bring ``entry`` up to ``version``: fetch rows whose ``updated_at`` changed, drop rows gone."""
    if entry.matrix is None:
        return load(table, where, columns, dims, max_rows, version)
    now = table.search().where(where).select(["id", "updated_at"]).limit(max_rows + 1).to_arrow()
    if now.num_rows > max_rows:
        return Entry(version)
    ids, stamps = now.column("id").to_pylist(), _stamps(now).tolist()
    known, index = entry.stamps, entry.index
    changed = [i for i, stamp in zip(ids, stamps, strict=True) if i not in index or known[index[i]] != stamp]
    gone = set(entry.ids).difference(ids)
    if not changed and not gone:
        return entry.at(version)
    if len(changed) > max(256, len(ids) // 4):
        return load(table, where, columns, dims, max_rows, version)
    fresh = table.search().where(and_all(where, sql_in("id", changed))).select([*columns, "vector"]).limit(None)
    rows = fresh.to_arrow().to_pylist()
    return entry.patched(version, gone | set(changed), rows)

