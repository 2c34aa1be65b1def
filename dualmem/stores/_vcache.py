"""Per-namespace vector cache: exact cosine search over a namespace's active rows in RAM.

A persona/user namespace is small (thousands of items) inside a large table;
LanceDB re-reads and decodes the vectors of a prefiltered flat scan on every
query, so the store keeps each searched namespace's normalised matrix in RAM
(LRU, bounded by rows) and searches it with one matrix product. Every write
through any ``DualStore`` of this process bumps a stamp (per namespace, or per
table when the namespace is unknown, as for ``delete(ids)``), so a stale matrix
is never used; table handles are shared per process (see ``_lance.open_or_create``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import nullcontext
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

Key = tuple[str, str, str]  # (uri, kind, namespace key)

_LOCK = threading.Lock()
_TABLE_STAMPS: dict[tuple[str, str], int] = {}
_NS_STAMPS: dict[Key, int] = {}


def bump(uri: str, kind: str, ns_key: str | None = None) -> None:
    """Record a write to one namespace (or to the whole table when ``ns_key`` is None)."""
    with _LOCK:
        if ns_key is None:
            _TABLE_STAMPS[(uri, kind)] = _TABLE_STAMPS.get((uri, kind), 0) + 1
        else:
            _NS_STAMPS[(uri, kind, ns_key)] = _NS_STAMPS.get((uri, kind, ns_key), 0) + 1


def stamp(key: Key) -> tuple[int, int]:
    """Return the current write stamp of a namespace."""
    return _TABLE_STAMPS.get(key[:2], 0), _NS_STAMPS.get(key, 0)  # type: ignore[index]


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


class Entry:
    """A namespace's active rows (without vectors), event times and unit-normalised vectors.

    ``matrix`` is None when the namespace was too large to cache.
    """

    __slots__ = ("stamp", "ids", "matrix", "rows", "event_time", "index")

    def __init__(self, stamp_: tuple[int, int], rows: pa.Table | None = None, matrix: np.ndarray | None = None) -> None:
        self.stamp, self.matrix, self.rows = stamp_, matrix, rows
        self.ids: list[str] = rows.column("id").to_pylist() if rows is not None else []
        self.index = {i: n for n, i in enumerate(self.ids)}
        times = rows.column("event_time").to_pylist() if rows is not None and "event_time" in rows.column_names else []
        self.event_time = np.asarray([t or "" for t in times], dtype=str)

    def __len__(self) -> int:
        return len(self.ids) if self.matrix is not None else 0

    def mask(
        self, since: str | None = None, until: str | None = None, ids: set[str] | None = None
    ) -> np.ndarray | None:
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

    def patched(self, stamp_: tuple[int, int], drop: set[str], rows: list[dict[str, Any]] | None = None) -> Entry:
        """Return a copy without the ``drop`` ids, plus ``rows`` (dicts with a ``vector``; active ones kept)."""
        assert self.matrix is not None and self.rows is not None
        keep = np.fromiter((i not in drop for i in self.ids), dtype=bool, count=len(self.ids))
        table, matrix = self.rows.filter(pa.array(keep)), self.matrix[keep]
        added = [r for r in rows or [] if r.get("status") == "active"]
        if added:
            vecs = np.asarray([r["vector"] for r in added], dtype=np.float32)
            vecs /= np.where((n := np.linalg.norm(vecs, axis=1, keepdims=True)) == 0, 1.0, n)
            extra = pa.Table.from_pylist([{c: r[c] for c in table.column_names} for r in added], schema=table.schema)
            table, matrix = pa.concat_tables([table, extra]).combine_chunks(), np.vstack([matrix, vecs])
        return Entry(stamp_, table, np.ascontiguousarray(matrix))

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
    """LRU of namespace matrices, bounded by the total number of cached rows."""

    def __init__(self, max_rows: int = 500_000) -> None:
        self.max_rows = max_rows
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()

    def get(self, key: Key) -> Entry | None:
        """Return the fresh entry of ``key`` or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.stamp != stamp(key):
                return None
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

    def patch(self, uri: str, kind: str, ns_key: str | None, drop: set[str], rows: list[dict[str, Any]]) -> None:
        """Record a write (see ``bump``) and apply it to this cache's fresh entries instead of dropping them.

        ``ns_key`` None means a write whose namespace is unknown (delete/supersede by id): every
        cached namespace of the table loses the ``drop`` ids.
        """
        with self._lock:
            keys = [k for k in self._entries if k[:2] == (uri, kind) and (ns_key is None or k[2] == ns_key)]
            before = {k: stamp(k) for k in keys}
            bump(uri, kind, ns_key)
            for key in keys:
                entry = self._entries[key]
                if entry.stamp != before[key] or entry.matrix is None:
                    continue
                new = entry.patched(stamp(key), drop, rows)
                self._rows += len(new) - len(entry)
                self._entries[key] = new


def load(table: Any, where: str, columns: list[str], dims: int, max_rows: int, stamp_: tuple[int, int]) -> Entry:
    """Read a namespace's rows and vectors from ``table`` (an uncached entry if over ``max_rows``)."""
    data = table.search().where(where).select([*columns, "vector"]).limit(max_rows + 1).to_arrow()
    if data.num_rows > max_rows:
        return Entry(stamp_)
    flat = data.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
    raw = np.asarray(flat, dtype=np.float32).reshape(data.num_rows, dims)
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    matrix = (raw / np.where(norms == 0, 1.0, norms)).astype(np.float32, copy=False)
    return Entry(stamp_, data.drop_columns(["vector"]).combine_chunks(), matrix)
