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
import pyarrow.compute as pc

import dualmem.stores._lance as L
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


def _times(rows: pa.Table | None) -> np.ndarray:
    """Return the rows' ``event_time`` as a numpy string array ("" for none)."""
    if rows is None or "event_time" not in rows.column_names:
        return np.asarray([], dtype=str)
    return np.asarray(rows.column("event_time").fill_null("").to_numpy(zero_copy_only=False), dtype=str)


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32, copy=False)


class _Buffer:
    """A growable float32 matrix shared by successive views of one namespace.

    A view is ``data[:n]``; a later view that only appends rows writes them after row ``n``
    (claimed under the lock, so two appenders never share a tail) and keeps the same buffer:
    earlier views never see the new rows, and no view's rows are ever written twice.
    """

    __slots__ = ("data", "used", "lock")

    def __init__(self, data: np.ndarray, used: int) -> None:
        self.data, self.used, self.lock = data, used, threading.Lock()

    @staticmethod
    def holding(matrix: np.ndarray, extra: np.ndarray) -> tuple[_Buffer, np.ndarray]:
        """Return a new buffer (with spare room) holding ``matrix`` then ``extra``, and the view of both."""
        n, m = len(matrix), len(extra)
        data = np.empty((n + m + max(64, (n + m) // 4), matrix.shape[1]), dtype=np.float32)
        data[:n], data[n : n + m] = matrix, extra
        return _Buffer(data, n + m), data[: n + m]

    def append(self, n: int, extra: np.ndarray) -> np.ndarray | None:
        """Write ``extra`` after the first ``n`` rows if nobody did yet and it fits; return the view (else None)."""
        m = len(extra)
        with self.lock:
            if self.used != n or n + m > len(self.data):
                return None
            self.used = n + m
        self.data[n : n + m] = extra
        return self.data[: n + m]


class Entry:
    """A namespace's active rows (without vectors), their unit-normalised vectors and the table version.

    ``matrix`` is None when the namespace was too large to hold. ``derived`` holds what readers
    compute from exactly these rows (a ranker's lexical index); a changed view starts without it.
    """

    __slots__ = ("version", "ids", "matrix", "rows", "event_time", "index", "stamps", "derived", "buffer")

    def __init__(self, version: int, rows: pa.Table | None = None, matrix: np.ndarray | None = None) -> None:
        self.version, self.matrix, self.rows = version, matrix, rows
        self.ids: list[str] = rows.column("id").to_pylist() if rows is not None else []
        self.index = {i: n for n, i in enumerate(self.ids)}
        self.event_time = _times(rows)
        self.stamps = _stamps(rows) if rows is not None else np.zeros(0, dtype=np.int64)
        self.derived: dict[str, Any] = {}
        self.buffer: _Buffer | None = None

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
        added = [r for r in rows or [] if r.get("status") == "active"]
        if not any(i in self.index for i in drop):
            return self._appended(version, added)
        keep = np.fromiter((i not in drop for i in self.ids), dtype=bool, count=len(self.ids))
        table, matrix = self.rows.filter(pa.array(keep)), self.matrix[keep]
        if added:
            vecs = _normalise(np.asarray([r["vector"] for r in added], dtype=np.float32))
            extra = pa.Table.from_pylist([{c: r[c] for c in table.column_names} for r in added], schema=table.schema)
            table, matrix = pa.concat_tables([table, extra]).combine_chunks(), np.vstack([matrix, vecs])
        return Entry(version, table, np.ascontiguousarray(matrix))

    def _appended(self, version: int, added: list[dict[str, Any]]) -> Entry:
        """Return a copy at ``version`` with ``added`` rows after the existing ones (nothing copied but the small parts)."""
        assert self.matrix is not None and self.rows is not None
        if not added:
            return self.at(version)
        vecs = _normalise(np.asarray([r["vector"] for r in added], dtype=np.float32))
        extra = pa.Table.from_pylist([{c: r[c] for c in self.rows.column_names} for r in added], schema=self.rows.schema)
        n = len(self.ids)
        matrix = self.buffer.append(n, vecs) if self.buffer is not None else None
        buffer = self.buffer
        if matrix is None:
            buffer, matrix = _Buffer.holding(self.matrix, vecs)
        table = pa.concat_tables([self.rows, extra])
        if table.column(0).num_chunks > 32:  # keep scans of the rows fast
            table = table.combine_chunks()
        entry = Entry.__new__(Entry)
        entry.version, entry.rows, entry.matrix, entry.buffer, entry.derived = version, table, matrix, buffer, {}
        new_ids = [r["id"] for r in added]
        entry.ids = self.ids + new_ids
        entry.index = dict(self.index)
        entry.index.update((i, n + k) for k, i in enumerate(new_ids))
        entry.event_time = np.concatenate([self.event_time, _times(extra)]) if len(self.event_time) else _times(table)
        entry.stamps = np.concatenate([self.stamps, _stamps(extra)])
        return entry

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
    data = L.scan(table, where, [*columns, "vector"], max_rows + 1)
    if data.num_rows > max_rows:
        return Entry(version)
    flat = data.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
    matrix = _normalise(np.asarray(flat, dtype=np.float32).reshape(data.num_rows, dims))
    return Entry(version, data.drop_columns(["vector"]).combine_chunks(), matrix)


def refresh(entry: Entry, table: Any, where: str, columns: list[str], dims: int, max_rows: int, version: int) -> Entry:
    """Bring ``entry`` up to ``version``: fetch rows whose ``updated_at`` changed, drop rows gone."""
    if entry.matrix is None or entry.rows is None:
        return load(table, where, columns, dims, max_rows, version)
    now = L.scan(table, where, ["id", "updated_at"], max_rows + 1)
    if now.num_rows > max_rows:
        return Entry(version)
    ids, stamps = now.column("id"), _stamps(now)
    known = entry.rows.column("id")
    if len(stamps) == len(entry.stamps) and np.array_equal(stamps, entry.stamps) and ids.equals(known):
        return entry.at(version)
    where_known = pc.index_in(ids, value_set=known).fill_null(-1).to_numpy(zero_copy_only=False)
    old = entry.stamps[np.maximum(where_known, 0)] if len(entry.stamps) else np.full(len(stamps), -2, dtype=np.int64)
    changed_mask = (where_known < 0) | (old != stamps)
    changed = pc.filter(ids, pa.array(changed_mask)).to_pylist()
    gone = set(pc.filter(known, pc.invert(pc.is_in(known, value_set=ids))).to_pylist())
    if not changed and not gone:
        return entry.at(version)
    if len(changed) > max(256, len(stamps) // 4):
        return load(table, where, columns, dims, max_rows, version)
    rows = L.scan(table, and_all(where, sql_in("id", changed)), [*columns, "vector"]).to_pylist() if changed else []
    return entry.patched(version, gone | set(changed), rows)
