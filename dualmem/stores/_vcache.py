"""Per-namespace vector view: exact cosine search over a namespace's active rows in RAM.

A persona/user namespace is small (thousands of items) inside a large table;
LanceDB re-reads and decodes the vectors of a prefiltered scan on every query,
so a store keeps each searched namespace's normalised matrix in RAM (LRU,
bounded by rows) and searches it with one matrix product.

The view is a cache keyed on the table version, never the truth. Each read
checks the table's latest version (one cheap manifest check): the same version
means the view is exact; a newer one means some process committed, and the
view is brought up to date. When the table only grew since the view was read
(the common case: new items appended), the rows after the view's *tail* — the
table's row count and last row when the view was read — are read by offset
(LanceDB prunes to the new fragments) and the namespace's among them are added;
the tail's last row must still be at its offset, so any delete or update before
it (rows shift) sends the refresh to the general path: read the namespace's
``(id, updated_at)`` pairs and fetch only the rows that changed (deleted ones are
dropped). The general path's cost grows with the fragments written since the
last compaction; the tail path's does not. A write made through the store that
holds the view patches it in place when no other commit came in between (its
commit is then the very next version).
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


class Tail:
    """The table's end when a view was read: its row count and the last row's ``pk`` and ``updated_at``."""

    __slots__ = ("rows", "pk", "stamp")

    def __init__(self, rows: int, pk: str, stamp: int) -> None:
        self.rows, self.pk, self.stamp = rows, pk, stamp


def read_tail(table: Any) -> Tail | None:
    """Return the table's tail, read at one version (None: empty, or a commit came in between)."""
    before = table.version
    total = table.count_rows()
    if total == 0:
        return None
    last = L.scan(table, None, ["pk", "updated_at"], limit=1, offset=total - 1)
    if last.num_rows != 1 or table.version != before:
        return None
    return Tail(total, last.column("pk")[0].as_py(), int(_stamps(last)[0]))


def _appended_rows(table: Any, tail: Tail | None, columns: list[str], cap: int) -> tuple[pa.Table, Tail] | None:
    """Return the rows after ``tail`` and the new tail, if the table only grew since (at most ``cap`` rows); else None."""
    if tail is None:
        return None
    wanted = list(dict.fromkeys(["pk", "namespace", "status", "updated_at", *columns, "vector"]))
    data = L.scan(table, None, wanted, limit=cap + 2, offset=tail.rows - 1)  # from the tail's last row on
    if data.num_rows == 0 or data.num_rows > cap + 1:
        return None
    stamps = _stamps(data)
    if data.column("pk")[0].as_py() != tail.pk or int(stamps[0]) != tail.stamp:
        return None  # rows before the tail moved: something was deleted or rewritten
    last = data.num_rows - 1
    return data.slice(1), Tail(tail.rows + last, data.column("pk")[last].as_py(), int(stamps[last]))


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

    __slots__ = ("version", "ids", "matrix", "rows", "event_time", "index", "stamps", "derived", "buffer", "tail")

    def __init__(self, version: int, rows: pa.Table | None = None, matrix: np.ndarray | None = None) -> None:
        self.version, self.matrix, self.rows = version, matrix, rows
        self.ids: list[str] = rows.column("id").to_pylist() if rows is not None else []
        self.index = {i: n for n, i in enumerate(self.ids)}
        self.event_time = _times(rows)
        self.stamps = _stamps(rows) if rows is not None else np.zeros(0, dtype=np.int64)
        self.derived: dict[str, Any] = {}
        self.buffer: _Buffer | None = None
        self.tail: Tail | None = None

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
        entry.tail = self.tail
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
    tail = read_tail(table)  # before the rows: whatever is appended after it is read by the next refresh
    data = L.scan(table, where, [*columns, "vector"], max_rows + 1)
    if data.num_rows > max_rows:
        return Entry(version)
    flat = data.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
    matrix = _normalise(np.asarray(flat, dtype=np.float32).reshape(data.num_rows, dims))
    entry = Entry(version, data.drop_columns(["vector"]).combine_chunks(), matrix)
    entry.tail = tail
    return entry


def refresh(entry: Entry, table: Any, where: str, columns: list[str], dims: int, max_rows: int, version: int,
            ns: str | None = None) -> Entry:  # fmt: skip
    """Bring ``entry`` up to ``version``: add the namespace's (``ns``) rows appended since the view was read, or fetch
    rows whose ``updated_at`` changed and drop rows gone."""
    if entry.matrix is None or entry.rows is None:
        return load(table, where, columns, dims, max_rows, version)
    appended = _appended_rows(table, entry.tail, columns, max(256, len(entry.ids) // 4)) if ns is not None else None
    if appended is not None:
        data, end = appended
        mine = data.filter(pc.equal(data.column("namespace"), ns))
        index, known = entry.index, entry.stamps
        fresh = [r for r, stamp in zip(mine.to_pylist(), _stamps(mine).tolist(), strict=True)
                 if not (r["id"] in index and stamp == known[index[r["id"]]])]  # fmt: skip
        if len(entry.ids) + len(fresh) > max_rows:
            return Entry(version)
        new = entry.patched(version, {r["id"] for r in fresh}, fresh) if fresh else entry.at(version)
        new.tail = end
        return new
    tail = read_tail(table)
    new = _changed(entry, table, where, columns, dims, max_rows, version)
    new.tail = tail
    return new


def _changed(entry: Entry, table: Any, where: str, columns: list[str], dims: int, max_rows: int, version: int) -> Entry:
    """Bring ``entry`` up to ``version`` by comparing the namespace's ``(id, updated_at)`` pairs with the view's."""
    assert entry.rows is not None
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
