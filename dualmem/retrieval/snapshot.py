"""The RAM snapshot retrieval ranks over: a namespace's active memory with its vectors, kept fresh by one rule.

**The rule.** A snapshot records the store's :meth:`~dualmem.stores.contract.DualStore.version`
when it was taken. On every read the version is asked again (one cheap call);
if it moved, the namespace's ``(id, updated_at)`` pairs are compared with the
snapshot's and only the rows that changed are fetched, at the addresses the
stamps gave where the backend gives addresses (or the namespace is reloaded
when much changed). Nothing else refreshes, patches or tails it, so
a snapshot always holds exactly the rows a fresh load would: sorted by key,
one per item — a pure function of the store's contents.

Snapshots belong to their reader (a :class:`~dualmem.retrieval.pipeline.Ranker`,
a writer run), kept in a :class:`Snapshots` LRU bounded by rows; the store
keeps no cache. ``derived`` holds what readers compute from exactly these
rows (candidate arrays, term matrices): it dies with the snapshot.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dualmem.schema import MemoryItem
from dualmem.stores._rows import row_to_item, stamps, vectors_of
from dualmem.stores.contract import DualStore, Namespace
from dualmem.stores.ranking import allowed


@dataclass
class Snapshot:
    """A namespace's active items at one store version: item columns (no vectors), unit vectors, stamps."""

    namespace: Namespace
    version: Any
    rows: pa.Table
    vectors: np.ndarray
    derived: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids: list[str] = self.rows.column("id").to_pylist()
        self.index = {i: n for n, i in enumerate(self.ids)}
        self.stamps = stamps(self.rows) if self.rows.num_rows else np.zeros(0, dtype=np.int64)
        self.kinds = np.asarray(self.rows.column("kind").to_pylist(), dtype=object)

    def __len__(self) -> int:
        return len(self.ids)

    def at(self, version: Any) -> Snapshot:
        """Mark this (copied) snapshot exact at ``version``: the namespace did not change (its ``derived`` stays)."""
        self.version = version
        return self

    def items(self, positions: Sequence[int]) -> list[MemoryItem]:
        """Return the memory items at these row positions."""
        if not len(positions):
            return []
        return [row_to_item(r) for r in self.rows.take(pa.array(list(positions), pa.int64())).to_pylist()]

    def mask(
        self,
        kinds: Sequence[str] | None = None,
        filter: Mapping[str, Any] | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> np.ndarray:
        """Return which rows are of ``kinds`` and pass ``filter`` and the ``event_time`` window (the stores' own
        filter: :func:`~dualmem.stores.ranking.allowed`)."""
        keep = np.ones(len(self), dtype=bool)
        if kinds is not None:
            keep &= np.isin(self.kinds, list(kinds))
        passed = allowed(self.rows, filter, since, until)
        return keep if passed is None else keep & passed


def load(store: DualStore, namespace: Namespace, version: Any) -> Snapshot:
    """Read a namespace's active rows and vectors."""
    data = store.scan(namespace, columns="vectors")
    return Snapshot(tuple(namespace), version, data.drop_columns(["vector"]), vectors_of(data, store.dims))


def refresh(snap: Snapshot, store: DualStore, version: Any) -> Snapshot:
    """Bring ``snap`` to ``version``: fetch the rows whose ``(id, updated_at)`` changed, drop the rows gone."""
    now = store.scan(snap.namespace, columns="stamps")
    ids, times = now.column("id"), stamps(now)
    known = snap.rows.column("id")
    where = pc.index_in(ids, value_set=known).fill_null(-1).to_numpy(zero_copy_only=False)
    old = snap.stamps[np.maximum(where, 0)] if len(snap.stamps) else np.full(len(times), -2, dtype=np.int64)
    moved = pa.array((where < 0) | (old != times))
    changed = pc.filter(ids, moved).to_pylist()
    at = pc.filter(now.column("row"), moved).to_pylist() if "row" in now.column_names else None  # a backend may lack it
    gone = pc.invert(pc.is_in(known, value_set=ids)).to_numpy(zero_copy_only=False)
    if not changed and not gone.any():
        return copy.copy(snap).at(version)
    if len(changed) + int(gone.sum()) > max(256, now.num_rows // 4):
        return load(store, snap.namespace, version)
    keep = ~gone & ~pc.is_in(known, value_set=pa.array(changed, pa.string())).to_numpy(zero_copy_only=False)
    fresh = store.scan(snap.namespace, columns="vectors", ids=changed, at=at) if changed else None  # read where seen
    return _merged(snap, np.flatnonzero(keep), fresh, store.dims, version)


def _merged(snap: Snapshot, kept: np.ndarray, fresh: pa.Table | None, dims: int, version: Any) -> Snapshot:
    """Return the snapshot of ``snap``'s ``kept`` rows and the ``fresh`` ones, sorted by key as a load is.

    Kept rows stay in order, so the result is runs of old rows with fresh rows between them: each run is one
    slice copy, and a refresh costs one pass over the snapshot, however few rows changed.
    """
    fresh_rows = snap.rows.slice(0, 0) if fresh is None else fresh.drop_columns(["vector"]).cast(snap.rows.schema)
    fresh_vectors = snap.vectors[:0] if fresh is None else vectors_of(fresh, dims)
    keys = pa.concat_arrays([snap.rows.column("pk").combine_chunks().take(kept), *fresh_rows.column("pk").chunks])
    src = pc.sort_indices(keys).to_numpy()  # position in (kept rows, then fresh rows) of each row of the result
    if not len(src):
        return Snapshot(snap.namespace, version, snap.rows.slice(0, 0), snap.vectors[:0])
    is_old = src < len(kept)
    origin = np.full(len(src), -1, dtype=np.int64)  # the old row of each row of the result (-1: a fresh row)
    origin[is_old] = kept[src[is_old]]
    cut = np.flatnonzero(~(is_old[1:] & is_old[:-1] & (origin[1:] == origin[:-1] + 1))) + 1
    matrix, parts = np.empty((len(src), dims), snap.vectors.dtype), []
    for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(src)], strict=True):
        if is_old[a]:
            matrix[a:b] = snap.vectors[origin[a] : origin[a] + b - a]
            parts.append(snap.rows.slice(int(origin[a]), b - a))
        else:  # one fresh row
            matrix[a] = fresh_vectors[src[a] - len(kept)]
            parts.append(fresh_rows.slice(int(src[a]) - len(kept), 1))
    return Snapshot(snap.namespace, version, pa.concat_tables(parts).combine_chunks(), matrix)


class Snapshots:
    """The snapshots one reader holds, per store and namespace (LRU, at most ``max_rows`` rows in all); thread-safe."""

    def __init__(self, max_rows: int = 500_000) -> None:
        self.max_rows = max_rows
        self._by_store: weakref.WeakKeyDictionary[DualStore, OrderedDict[Namespace, Snapshot]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def get(self, store: DualStore, namespace: Namespace) -> Snapshot:
        """Return the namespace's snapshot at the store's latest version."""
        namespace = tuple(namespace)
        version = store.version()
        with self._lock:
            held = self._by_store.setdefault(store, OrderedDict())
            snap = held.get(namespace)
        if snap is not None and snap.version == version:
            fresh = snap
        else:
            fresh = load(store, namespace, version) if snap is None else refresh(snap, store, version)
        with self._lock:
            held = self._by_store.setdefault(store, OrderedDict())
            held[namespace] = fresh
            held.move_to_end(namespace)
            self._evict()
        return fresh

    def _evict(self) -> None:
        total = sum(len(s) for held in self._by_store.values() for s in held.values())
        for held in list(self._by_store.values()):
            while total > self.max_rows and len(held) > 1:
                _, gone = held.popitem(last=False)
                total -= len(gone)
