"""The one store contract of the dual memory: operations, and ``DualStore`` built on ``batch(ops)`` / ``abatch(ops)``.

A backend (:class:`~dualmem.stores.memory.InMemoryDualStore`, :class:`~dualmem.stores.lance.LanceDualStore`)
implements only ``_apply(ops)``, the exact-once primitives (``ledger``, ``exclusive``) and ``version``; this class
gives every other method, as LangGraph's ``BaseStore`` does for its stores. ``batch`` prepares the operations (embeds
the texts and queries that came without vectors) and applies them; ``abatch`` embeds asynchronously and applies in a
worker thread. Reads in one batch see the store before the batch's writes only as far as the backend applies them in
order.

Invariants every backend keeps (one conformance suite checks both):

- **one row per key**: an item's key is ``(namespace, id)``; after any interleaving of puts and deletes, from threads
  or processes, a key has one row or none, and no read returns two items for one key (the put that commits last
  wins; a row with the later ``updated_at`` wins ties in legacy tables);
- **isolated**: every operation names one namespace (or a prefix, for listing
  namespaces); nothing reaches another namespace's items;
- **fresh**: a read sees every write that finished before it began, in any process that opened the same store;
- rows are the arrow rows of :mod:`dualmem.stores._rows` (vectors unit-normalised,
  float16-rounded), so both backends hold and return identical data.
"""

from __future__ import annotations

import asyncio
import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import pyarrow as pa
from langchain_core.embeddings import Embeddings

from dualmem.errors import ConfigurationError
from dualmem.schema import MemoryItem, MemoryKind
from dualmem.stores._rows import row_addresses, row_to_item
from dualmem.stores.results import ScoredItem

Namespace = tuple[str, ...]
SearchMode = Literal["hybrid", "vector", "fts"]
Columns = Literal["stamps", "items", "vectors"]
KINDS: tuple[MemoryKind, ...] = ("fact", "insight")
FILTERABLE = {name: name for name in ("id", "session_id", "chunk_id", "event_time", "status")}
"""Fields a structured ``filter`` may name (public key -> column)."""


# --------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class GetItems:
    """Read the items of these ids (any status); missing ids are skipped, order kept."""

    namespace: Namespace
    ids: tuple[str, ...]


@dataclass(frozen=True)
class ScanItems:
    """Read a namespace's rows as an arrow table: ``stamps`` (pk, id, updated_at, ``row``: where the backend holds
    that row version, null if it has no addresses), ``items`` (item columns) or ``vectors`` (item columns and
    ``vector``); ``status`` None reads every status, ``ids`` narrows to those ids. ``at`` (with ``ids``) passes back
    their ``row`` from a stamps scan: rows are read there while still current, else by id — the same result."""

    namespace: Namespace
    kind: MemoryKind | None = None
    status: str | None = "active"
    columns: Columns = "items"
    ids: tuple[str, ...] | None = None
    at: tuple[int | None, ...] | None = None


@dataclass(frozen=True)
class CountItems:
    """Count a namespace's items."""

    namespace: Namespace
    kind: MemoryKind | None = None
    status: str | None = "active"


@dataclass(frozen=True)
class SearchItems:
    """Rank a namespace's items for a query: cosine (``vector``), BM25 (``fts``) or both fused by reciprocal rank."""

    namespace: Namespace
    query: str
    kind: MemoryKind | None = None
    k: int = 10
    mode: SearchMode = "hybrid"
    status: str | None = "active"
    filter: Mapping[str, Any] | None = None
    since: str | None = None
    until: str | None = None
    vector: tuple[float, ...] | None = None


@dataclass(frozen=True)
class PutItems:
    """Insert or replace items by (namespace, id), exactly as given; ``vectors`` one per item (embedded when None).

    Rows are stamped ``updated_at`` = the time of the write, unless ``keep_times`` (a restore: the items' own).
    """

    items: tuple[MemoryItem, ...]
    vectors: tuple[tuple[float, ...], ...] | None = None
    keep_times: bool = False


@dataclass(frozen=True)
class SetStatus:
    """Set the status of items (``superseded`` keeps them for history and hides them from search)."""

    namespace: Namespace
    ids: tuple[str, ...]
    status: str = "superseded"


@dataclass(frozen=True)
class DeleteItems:
    """Delete items for good (``ids`` None: every item of the namespace); returns how many rows went."""

    namespace: Namespace
    ids: tuple[str, ...] | None


@dataclass(frozen=True)
class ListNamespaces:
    """List the namespaces holding items (of ``kind``) at or below ``prefix``."""

    prefix: Namespace = ()
    kind: MemoryKind | None = None


MemoryOp = GetItems | ScanItems | CountItems | SearchItems | PutItems | SetStatus | DeleteItems | ListNamespaces


# --------------------------------------------------------------------------- exactly once


class Lease(Protocol):
    """A held write lease: ``check()`` raises ``LeaseLost`` unless it is surely still ours (a fence before a commit);
    ``waited_s``: the seconds its taker waited for other writers of the namespace before taking it (a store's lease
    without it reports 0.0)."""

    waited_s: float

    def check(self) -> None: ...


class Ledger(Protocol):
    """Units of work (writer chunks, ingested sessions) a namespace drafted (``pending``) or ``applied``.

    Writers change a namespace's rows only while holding its write lease, and apply every
    pending plan before drafting a new one, so nothing is asked twice, lost or applied twice.
    """

    def look(self, namespace: Sequence[str], unit: str) -> tuple[tuple[str, str] | None, list[tuple[str, str]]]:
        """Return (the state and payload of ``unit`` or None, the namespace's pending units oldest first)."""
        ...

    def applied(self, namespace: Sequence[str], unit: str) -> bool:
        """Return True if ``unit`` was applied to ``namespace``."""
        ...

    def applied_ids(self, namespace: Sequence[str]) -> set[str]:
        """Return the ids of every applied unit of a namespace."""
        ...

    def units(self, namespace: Sequence[str]) -> tuple[set[str], list[tuple[str, str]]]:
        """Return (the ids of every applied unit, the pending units oldest first with their payloads) in one read."""
        ...

    def mark(self, namespace: Sequence[str], unit: str, state: str, payload: str = "") -> None:
        """Record a unit's state (upsert); call it while holding the namespace's write lease."""
        ...

    def mark_all(self, namespace: Sequence[str], marks: Sequence[tuple[str, str, str]]) -> None:
        """Record several ``(unit, state, payload)`` at once (one commit); call it while holding the write lease."""
        ...

    def drop(self, namespace: Sequence[str]) -> int:
        """Forget every unit of a namespace; return how many."""
        ...


# --------------------------------------------------------------------------- the store


def check_kind(kind: str | None) -> MemoryKind | None:
    """Return ``kind`` if it is None, ``fact`` or ``insight``; else raise naming the choices."""
    if kind is not None and kind not in KINDS:
        raise ConfigurationError(f"memory kind {kind!r} is not one of fact, insight")
    return kind  # type: ignore[return-value]


def check_mode(mode: str) -> SearchMode:
    """Return ``mode`` if it is a search mode; else raise naming the choices."""
    if mode not in ("hybrid", "vector", "fts"):
        raise ConfigurationError(f"search mode {mode!r} is not one of hybrid, vector, fts")
    return mode  # type: ignore[return-value]


class DualStore(ABC):
    """Facts and insights of many namespaces: the store contract (see the module docstring).

    ``embeddings`` embeds texts and queries; ``dims`` is its vector size; ``uri`` names the store.
    """

    embeddings: Embeddings
    dims: int
    uri: str
    ledger: Ledger

    # ------------------------------------------------------------------ what a backend implements

    @abstractmethod
    def _apply(self, ops: Sequence[MemoryOp]) -> builtins.list[Any]:
        """Apply prepared operations (every vector given) in order; return one result per operation."""

    @abstractmethod
    def version(self) -> Any:
        """Return a token that changes whenever any item of the store changes (what RAM snapshots are keyed on)."""

    @abstractmethod
    def exclusive(
        self,
        namespace: Namespace,
        owner: str | None = None,
        wait_s: float | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> AbstractContextManager[Lease | None]:
        """Hold the namespace's write lease for a ``with`` block (one writer per namespace, in any process).

        With ``give_up``, waiting ends when it answers True and the block gets None.
        """

    def chunk_applied(self, namespace: Namespace, unit: str) -> bool:
        """Return True if the unit of work (a writer chunk, an ingested session) was applied to ``namespace``."""
        return self.ledger.applied(namespace, unit)

    def maintain(self) -> dict[str, int]:
        """Compact storage and repair legacy duplicate rows; return what was done (a backend's own figures)."""
        return {}

    # ------------------------------------------------------------------ shells

    def batch(self, ops: Iterable[MemoryOp]) -> builtins.list[Any]:
        """Embed what the operations need, then apply them; one result per operation."""
        ops = builtins.list(ops)
        texts, queries = _needs(ops)
        docs = self.embeddings.embed_documents(texts) if texts else []
        qvecs = [self.embeddings.embed_query(q) for q in queries]
        return self._apply(_filled(ops, docs, qvecs))

    async def abatch(self, ops: Iterable[MemoryOp]) -> builtins.list[Any]:
        """Async :meth:`batch`: embeds with the embedder's async methods, applies in a worker thread."""
        ops = builtins.list(ops)
        texts, queries = _needs(ops)
        docs = await self.embeddings.aembed_documents(texts) if texts else []
        qvecs = builtins.list(await asyncio.gather(*(self.embeddings.aembed_query(q) for q in queries)))
        return await asyncio.to_thread(self._apply, _filled(ops, docs, qvecs))

    # ------------------------------------------------------------------ writes

    def upsert(self, items: Sequence[MemoryItem], vectors: Sequence[Sequence[float]] | None = None) -> None:
        """Insert or replace items by (namespace, id) exactly as given (texts embedded unless ``vectors``)."""
        if vectors is not None and len(vectors) != len(items):
            raise ValueError(f"upsert got {len(items)} items but {len(vectors)} vectors; pass one vector per item")
        if items:
            vecs = None if vectors is None else tuple(tuple(float(x) for x in v) for v in vectors)
            self.batch([PutItems(tuple(items), vecs)])

    def supersede(self, namespace: Namespace, ids: Sequence[str]) -> None:
        """Mark items superseded: kept for history, hidden from search and listing."""
        if ids:
            self.batch([SetStatus(tuple(namespace), tuple(ids), "superseded")])

    def delete(self, namespace: Namespace, ids: Sequence[str]) -> int:
        """Delete items of ``namespace`` for good; return how many rows went."""
        if isinstance(ids, str):
            raise TypeError("delete(namespace, ids) takes a list of ids")
        return int(self.batch([DeleteItems(tuple(namespace), tuple(ids))])[0]) if ids else 0

    def drop_namespace(self, namespace: Namespace) -> int:
        """Delete every item and ledger row of a namespace; return how many items went."""
        gone = int(self.batch([DeleteItems(tuple(namespace), None)])[0])
        self.ledger.drop(namespace)
        return gone

    def forget_namespace(self, namespace: Namespace, wait_s: float | None = 0.0) -> dict[str, int]:
        """Forget a namespace for good under its write lease (``wait_s``: how long to wait for a writer): every item and
        ledger unit, on disk also their bytes and the lease row; return ``{"items": n, "ledger": n}``."""
        with self.exclusive(tuple(namespace), wait_s=wait_s):
            items = int(self.batch([DeleteItems(tuple(namespace), None)])[0])
            return {"items": items, "ledger": self.ledger.drop(namespace)}

    def forget_item(self, namespace: Namespace, item_id: str, wait_s: float | None = 0.0) -> dict[str, int]:
        """Forget one item for good, like :meth:`forget_namespace`: its row, its version rows, its text in the ledger's plans."""
        raise NotImplementedError(f"{type(self).__name__} cannot forget an item")

    # ------------------------------------------------------------------ reads

    def get(self, namespace: Namespace, ids: Sequence[str]) -> builtins.list[MemoryItem]:
        """Return the items of ``namespace`` with these ids (any status; missing ids skipped, order kept)."""
        if isinstance(ids, str):
            raise TypeError("get(namespace, ids) takes a list of ids")
        return self.batch([GetItems(tuple(namespace), tuple(ids))])[0] if ids else []

    def scan(
        self,
        namespace: Namespace,
        kind: MemoryKind | None = None,
        status: str | None = "active",
        columns: Columns = "items",
        ids: Sequence[str] | None = None,
        at: Sequence[int | None] | None = None,
    ) -> pa.Table:
        """Return a namespace's rows as arrow (at most one per id); see :class:`ScanItems`."""
        chosen, where = None if ids is None else tuple(ids), None if at is None else row_addresses(at)
        return self.batch([ScanItems(tuple(namespace), check_kind(kind), status, columns, chosen, where)])[0]

    def list(
        self,
        namespace: Namespace,
        kind: MemoryKind | None = None,
        status: str | None = "active",
        limit: int | None = None,
        newest_first: bool = True,
    ) -> builtins.list[MemoryItem]:
        """List a namespace's items ordered by (created_at, updated_at, id), newest first unless told otherwise."""
        rows = self.scan(namespace, kind, status).to_pylist()
        rows.sort(key=lambda r: (r["created_at"], r["updated_at"], r["id"]), reverse=newest_first)
        return [row_to_item(r) for r in (rows if limit is None else rows[: max(0, limit)])]

    def count(self, namespace: Namespace, kind: MemoryKind | None = None, status: str | None = "active") -> int:
        """Count a namespace's items."""
        return int(self.batch([CountItems(tuple(namespace), check_kind(kind), status)])[0])

    def namespaces(self, prefix: Namespace = (), kind: MemoryKind | None = None) -> builtins.list[Namespace]:
        """List the namespaces holding items (of ``kind``) at or below ``prefix``, sorted."""
        return sorted(self.batch([ListNamespaces(tuple(prefix), check_kind(kind))])[0])

    def search(
        self,
        namespace: Namespace,
        query: str,
        kind: MemoryKind | None = None,
        k: int = 10,
        mode: SearchMode = "hybrid",
        status: str | None = "active",
        filter: Mapping[str, Any] | None = None,
        since: str | None = None,
        until: str | None = None,
        vector: Sequence[float] | None = None,
    ) -> builtins.list[ScoredItem]:
        """Search one namespace; ``filter`` is a dict over :data:`FILTERABLE` fields, ``since``/``until`` bound
        ``event_time`` (ISO text). Scores: cosine (``vector``), BM25 (``fts``) or reciprocal-rank fusion (``hybrid``)."""
        vec = None if vector is None else tuple(float(x) for x in vector)
        op = SearchItems(
            tuple(namespace), query, check_kind(kind), k, check_mode(mode), status, filter, since, until, vec
        )
        return self.batch([op])[0] if k > 0 else []

    def grounding(
        self, namespace: Namespace, insights: Sequence[MemoryItem], known: Mapping[str, MemoryItem] | None = None
    ) -> dict[str, builtins.list[MemoryItem]]:
        """Return, per insight id, the facts of ``namespace`` it cites (missing ones skipped); ``known``: items of
        ``namespace`` at hand by id (a reader's snapshot), so only cited ids not in it are read from the store."""
        cited = builtins.list(dict.fromkeys(f for i in insights for f in i.grounding))
        by_id = {f: known[f] for f in cited if known and f in known}
        by_id.update({f.id: f for f in self.get(namespace, [f for f in cited if f not in by_id])})
        return {i.id: [by_id[f] for f in i.grounding if f in by_id and by_id[f].kind == "fact"] for i in insights}


# --------------------------------------------------------------------------- preparing operations


def _needs(ops: Sequence[MemoryOp]) -> tuple[builtins.list[str], builtins.list[str]]:
    """Return the document texts and queries the operations need embedded."""
    texts = [item.text for op in ops if isinstance(op, PutItems) and op.vectors is None for item in op.items]
    queries = [op.query for op in ops if isinstance(op, SearchItems) and op.vector is None and op.mode != "fts"]
    return texts, queries


def _filled(
    ops: Sequence[MemoryOp], docs: Sequence[Sequence[float]], qvecs: Sequence[Sequence[float]]
) -> builtins.list[MemoryOp]:
    """Return the operations with the embedded vectors put in."""
    doc_iter, q_iter = iter(docs), iter(qvecs)
    out: builtins.list[MemoryOp] = []
    for op in ops:
        if isinstance(op, PutItems) and op.vectors is None:
            op = replace(op, vectors=tuple(tuple(float(x) for x in next(doc_iter)) for _ in op.items))
        elif isinstance(op, SearchItems) and op.vector is None and op.mode != "fts":
            op = replace(op, vector=tuple(float(x) for x in next(q_iter)))
        out.append(op)
    return out
