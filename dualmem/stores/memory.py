"""The in-memory backend of the dual store: tests, notebooks, training, and trying DualMem without a disk.

Rows live in a dict keyed by ``pk`` (one row per key by construction) under one
lock; a write bumps :meth:`InMemoryDualStore.version`. The ledger is a dict and
a namespace's write lease a lock of this object: exactly-once holds between the
threads of one process, which is all an in-memory store can be shared by.
A search selects the namespace's rows of the kind and status and ranks them with
the one ranker of :mod:`~dualmem.stores.ranking`, as the LanceDB backend does.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa
from langchain_core.embeddings import Embeddings
from langgraph.store.memory import InMemoryStore

from dualmem.errors import ConfigurationError, LeaseTimeout
from dualmem.memory.versions import VERSION_OF
from dualmem.schema import utcnow
from dualmem.stores import ranking
from dualmem.stores._put import put_rows
from dualmem.stores._rows import ITEM_COLUMNS, STAMP_COLUMNS, item_schema, row_to_item
from dualmem.stores._sql import ns_key, ns_parse, row_key
from dualmem.stores.contract import (
    FILTERABLE,
    CountItems,
    DeleteItems,
    DualStore,
    GetItems,
    ListNamespaces,
    MemoryOp,
    Namespace,
    PutItems,
    ScanItems,
    SearchItems,
    SetStatus,
)
from dualmem.stores.erase import scrub
from dualmem.stores.results import ScoredItem


class _NoLease:
    """The lease of an in-memory namespace: held while its lock is, never lost; ``waited_s`` as
    :class:`dualmem.stores.leases.Lease`'s."""

    def __init__(self, waited_s: float = 0.0) -> None:
        self.waited_s = waited_s

    def check(self) -> None:
        """Nothing to check: no other process can take it."""


class InMemoryLedger:
    """Pending and applied units per namespace, in a dict (insertion order is drafting order)."""

    def __init__(self) -> None:
        self._units: dict[tuple[str, str], tuple[str, str]] = {}
        self._lock = threading.Lock()

    def look(self, namespace: Sequence[str], unit: str) -> tuple[tuple[str, str] | None, list[tuple[str, str]]]:
        """Return (the state and payload of ``unit`` or None, the namespace's pending units oldest first)."""
        key = ns_key(namespace)
        with self._lock:
            pending = [(u, p) for (ns, u), (s, p) in self._units.items() if ns == key and s == "pending"]
            return self._units.get((key, unit)), pending

    def applied(self, namespace: Sequence[str], unit: str) -> bool:
        """Return True if ``unit`` was applied to ``namespace``."""
        found = self._units.get((ns_key(namespace), unit))
        return found is not None and found[0] == "applied"

    def applied_ids(self, namespace: Sequence[str]) -> set[str]:
        """Return the ids of every applied unit of a namespace."""
        key = ns_key(namespace)
        with self._lock:
            return {u for (ns, u), (s, _) in self._units.items() if ns == key and s == "applied"}

    def units(self, namespace: Sequence[str]) -> tuple[set[str], list[tuple[str, str]]]:
        """Return (the ids of every applied unit, the pending units oldest first with their payloads) in one read."""
        key = ns_key(namespace)
        with self._lock:
            mine = [(u, s, p) for (ns, u), (s, p) in self._units.items() if ns == key]
        return {u for u, s, _ in mine if s == "applied"}, [(u, p) for u, s, p in mine if s == "pending"]

    def mark(self, namespace: Sequence[str], unit: str, state: str, payload: str = "") -> None:
        """Record a unit's state."""
        self.mark_all(namespace, [(unit, state, payload)])

    def mark_all(self, namespace: Sequence[str], marks: Sequence[tuple[str, str, str]]) -> None:
        """Record several ``(unit, state, payload)`` at once."""
        with self._lock:
            for unit, state, payload in marks:
                self._units[(ns_key(namespace), unit)] = (state, payload)

    def scrub(self, namespace: Sequence[str], ids: set[str]) -> int:
        """Remove ``ids`` from the plans of a namespace's units; return how many units changed."""
        key, changed = ns_key(namespace), 0
        with self._lock:
            for (ns, unit), (state, payload) in list(self._units.items()):
                if ns == key and payload and any(i in payload for i in ids):
                    self._units[(ns, unit)] = (state, json.dumps(scrub(json.loads(payload), ids), default=str))
                    changed += 1
        return changed

    def drop(self, namespace: Sequence[str]) -> int:
        """Forget every unit of a namespace; return how many."""
        key = ns_key(namespace)
        with self._lock:
            gone = [k for k in self._units if k[0] == key]
            for k in gone:
                del self._units[k]
        return len(gone)


class InMemoryDualStore(DualStore):
    """Facts and insights in a dict, with the LanceDB backend's behaviour (see the module docstring)."""

    def __init__(self, embeddings: Embeddings, *, dims: int | None = None, lease_wait_s: float = 900.0) -> None:
        if embeddings is None:
            raise ConfigurationError(
                "InMemoryDualStore needs an embeddings object (e.g. dualmem.testing.HashEmbeddings)"
            )
        from dualmem.models import embedding_dims

        self.uri = "memory://"
        self.embeddings = embeddings
        self.dims = dims or embedding_dims(embeddings)
        self.ledger: InMemoryLedger = InMemoryLedger()
        self.lease_wait_s = lease_wait_s
        self._schema = item_schema(self.dims)
        self._rows: dict[str, dict[str, Any]] = {}  # pk -> row
        self._lock = threading.RLock()
        self._version = 0
        self._last = utcnow()
        self._leases: dict[str, threading.Lock] = {}
        self.kv = InMemoryStore(
            index={"dims": self.dims, "embed": embeddings, "fields": ["$"]}
        )  # LangGraph items beside it

    # ------------------------------------------------------------------ contract

    def version(self) -> int:
        """Return the number of writes made so far."""
        return self._version

    @contextmanager
    def exclusive(
        self,
        namespace: Namespace,
        owner: str | None = None,
        wait_s: float | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> Iterator[_NoLease | None]:
        """Hold the namespace's lock for the block (waiting up to ``wait_s``, or until ``give_up`` answers True)."""
        with self._lock:
            lock = self._leases.setdefault(ns_key(namespace), threading.Lock())
        limit = self.lease_wait_s if wait_s is None else wait_s
        asked = time.monotonic()
        deadline = asked + limit
        while not lock.acquire(timeout=0.05):
            if give_up is not None and give_up():
                yield None
                return
            if time.monotonic() >= deadline:
                raise LeaseTimeout(
                    f"namespace {tuple(namespace)} is being written by another thread; waited {limit:.0f} s"
                )
        try:
            yield _NoLease(time.monotonic() - asked)
        finally:
            lock.release()

    def forget_item(self, namespace: Namespace, item_id: str, wait_s: float | None = 0.0) -> dict[str, int]:
        """Forget one item under the namespace's lock: its row, its version rows, its text in the ledger's plans."""
        ns = tuple(namespace)
        with self.exclusive(ns, wait_s=wait_s):
            with self._lock:
                rows = self._select(ns, None, None)
            ids = [r["id"] for r in rows if item_id in (r["id"], json.loads(r["meta"] or "{}").get(VERSION_OF))]
            return {"items": self.delete(ns, ids), "ledger": self.ledger.scrub(ns, {*ids, item_id})}

    def _apply(self, ops: Sequence[MemoryOp]) -> builtins.list[Any]:
        with self._lock:
            return [self._one(op) for op in ops]

    def _one(self, op: MemoryOp) -> Any:
        if isinstance(op, GetItems):
            return [row_to_item(self._rows[pk]) for i in op.ids if (pk := row_key(op.namespace, i)) in self._rows]
        if isinstance(op, ScanItems):
            wanted = None if op.ids is None else set(op.ids)
            rows = [r for r in self._select(op.namespace, op.kind, op.status) if wanted is None or r["id"] in wanted]
            return self._arrow(rows, op.columns)
        if isinstance(op, CountItems):
            return len(self._select(op.namespace, op.kind, op.status))
        if isinstance(op, SearchItems):
            return self._search(op)
        if isinstance(op, PutItems):
            for row in put_rows(op, self.dims, self._now()):
                self._rows[row["pk"]] = row
            self._version += 1
            return None
        if isinstance(op, SetStatus):
            now = self._now()
            for i in op.ids:
                if (key := row_key(op.namespace, i)) in self._rows:
                    self._rows[key].update(status=op.status, updated_at=now)
            self._version += 1
            return None
        if isinstance(op, DeleteItems):
            key = ns_key(op.namespace)
            gone = [
                pk for pk, r in self._rows.items() if r["namespace"] == key and (op.ids is None or r["id"] in op.ids)
            ]
            for pk in gone:
                del self._rows[pk]
            self._version += 1
            return len(gone)
        if isinstance(op, ListNamespaces):
            found = {ns_parse(r["namespace"]) for r in self._rows.values() if op.kind is None or r["kind"] == op.kind}
            return [ns for ns in found if ns[: len(op.prefix)] == tuple(op.prefix)]
        raise ValueError(f"unknown store operation {type(op).__name__}")

    # ------------------------------------------------------------------ helpers

    def _now(self) -> Any:
        """Return the write time: now, but always after the previous write's (updated_at orders this store's writes)."""
        now = utcnow()
        self._last = now if now > self._last else self._last + timedelta(microseconds=1)
        return self._last

    def _select(self, namespace: Namespace, kind: str | None, status: str | None) -> builtins.list[dict[str, Any]]:
        key = ns_key(namespace)
        rows = [
            r
            for r in self._rows.values()
            if r["namespace"] == key
            and (kind is None or r["kind"] == kind)
            and (status is None or r["status"] == status)
        ]
        return sorted(rows, key=lambda r: r["pk"])

    def _arrow(self, rows: builtins.list[dict[str, Any]], columns: str) -> pa.Table:
        names = {"stamps": STAMP_COLUMNS, "items": ITEM_COLUMNS, "vectors": [*ITEM_COLUMNS, "vector"]}[columns]
        schema = pa.schema([self._schema.field(n) for n in names])
        out = pa.Table.from_pylist([{n: r[n] for n in names} for r in rows], schema=schema)
        return (
            out.append_column("row", pa.nulls(len(rows), pa.uint64())) if columns == "stamps" else out
        )  # no addresses

    def _search(self, op: SearchItems) -> builtins.list[ScoredItem]:
        """Rank the namespace's rows of the kind and status with the one ranker (:mod:`~dualmem.stores.ranking`)."""
        rows = self._select(op.namespace, op.kind, op.status)
        fields = FILTERABLE.values() if op.filter or op.since or op.until else ()  # event_time is one of them
        columns = pa.table({n: pa.array([r[n] for r in rows], self._schema.field(n).type) for n in fields})
        mask = ranking.allowed(columns, op.filter, op.since, op.until)
        vectors = None if op.mode == "fts" else np.asarray([r["vector"] for r in rows], dtype=np.float32)
        corpus = ranking.Corpus(np.asarray([r["pk"] for r in rows], dtype=object), vectors, [r["text"] for r in rows])
        found = ranking.search(corpus, op.query, op.vector, op.k, op.mode, mask)
        return [ScoredItem(row_to_item(rows[n]), score) for n, score in found]
