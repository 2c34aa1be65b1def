"""LangGraph ``BaseStore`` views of DualMem: any graph's long-term memory, with the dual memory inside it.

:class:`DualMemStore` joins two stores under one LangGraph API: the facts and
insights of a :class:`~dualmem.stores.contract.DualStore` appear under
``(memory_label, persona, user, "fact" | "insight")`` (:mod:`~dualmem.stores.memory_view`),
and every other namespace holds ordinary key-value items of a ``BaseStore``
(profiles, tool memories, chat turns waiting for memory formation). A search
whose prefix covers both returns both, ranked on one scale.

- :class:`LanceDBStore` — on LanceDB (a folder or object storage), shared by
  server workers, ``dualmem ingest`` and other processes: key-value items in
  :class:`~dualmem.stores.kv.LanceKVStore`, the dual memory in the
  :class:`~dualmem.stores.lance.LanceDualStore` at the same URI. ``LanceDBStore(path)``
  sees the memory ``dualmem ingest`` wrote there, with the embedder the store
  was written with (recorded in the store).
- ``DualMemStore(InMemoryStore(...), InMemoryDualStore(...))`` — the same in RAM.

Only ``batch``/``abatch`` are implemented: reads see the store before the
batch's writes, as in LangGraph's own stores.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.stores._match import list_namespaces
from dualmem.stores._sweeper import Stopped, SweeperFuture
from dualmem.stores.contract import DualStore
from dualmem.stores.kv import LanceKVStore
from dualmem.stores.memory_view import MemoryView

DEFAULT_LABEL = "dualmem"


class DualMemStore(BaseStore):
    """Key-value items of ``kv`` and the dual memory of ``dual`` behind one LangGraph store (see the module docstring)."""

    def __init__(self, kv: BaseStore, dual: DualStore | None = None, *, memory_label: str = DEFAULT_LABEL) -> None:
        self.kv = kv
        self._dual = dual
        self.memory_label = memory_label
        MemoryView.check_label(memory_label)

    @property
    def supports_ttl(self) -> bool:  # type: ignore[override]
        """Whether puts may carry a ``ttl`` (the key-value store's answer)."""
        return bool(getattr(self.kv, "supports_ttl", False))

    @property
    def ttl_config(self) -> TTLConfig | None:  # type: ignore[override]
        """The key-value store's TTL configuration."""
        return getattr(self.kv, "ttl_config", None)

    @property
    def index_config(self) -> dict[str, Any] | None:
        """The key-value items' index (``{"dims", "embed", "fields", …}`` as given), as LangGraph's stores expose it."""
        return getattr(self.kv, "index_config", None)

    @property
    def dual(self) -> DualStore:
        """Return the dual store (facts and insights) behind the memory namespaces."""
        if self._dual is None:
            self._dual = self._open_dual()
        return self._dual

    def _open_dual(self) -> DualStore:
        raise ConfigurationError("this store has no dual memory; pass dual= (a DualStore) when creating it")

    @property
    def memory(self) -> MemoryView:
        """Return the facts and insights as store items."""
        return MemoryView(self.dual, self.memory_label)

    def _has_memory(self) -> bool:
        return self._dual is not None

    # ------------------------------------------------------------------ shells

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops``; one result per op (reads see the store before the batch's writes)."""
        ops = list(ops)
        kv_ops, parts = self._split(ops)
        queries = self._memory_queries(ops)
        qvecs = {q: self.dual.embeddings.embed_query(q) for q in queries}
        mem = self._memory_reads(ops, qvecs)
        kv_results = self.kv.batch(kv_ops) if kv_ops else []
        self._memory_writes(ops)
        return self._join(ops, parts, kv_results, mem)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch` (the key-value store's ``abatch``; memory work in a worker thread)."""
        ops = list(ops)
        kv_ops, parts = self._split(ops)
        queries = self._memory_queries(ops)
        vectors = await asyncio.gather(*(self.dual.embeddings.aembed_query(q) for q in queries)) if queries else []
        qvecs = dict(zip(queries, vectors, strict=True))
        mem = await asyncio.to_thread(self._memory_reads, ops, qvecs)
        kv_results = await self.kv.abatch(kv_ops) if kv_ops else []
        await asyncio.to_thread(self._memory_writes, ops)
        return self._join(ops, parts, kv_results, mem)

    # ------------------------------------------------------------------ routing

    def _owned(self, namespace: tuple[str, ...]) -> bool:
        return MemoryView.owns_namespace(namespace, self.memory_label)

    def _reaches_memory(self, prefix: tuple[str, ...]) -> bool:
        return self._has_memory() and MemoryView.covers_prefix(prefix, self.memory_label)

    def _split(self, ops: list[Op]) -> tuple[list[Op], list[int | None]]:
        """Return the ops the key-value store runs and, per op, the index of its key-value result (None: none)."""
        kv_ops: list[Op] = []
        parts: list[int | None] = []
        for op in ops:
            if isinstance(op, GetOp | PutOp) and self._owned(tuple(op.namespace)):
                parts.append(None)
                continue
            if isinstance(op, SearchOp) and self._reaches_memory(tuple(op.namespace_prefix)):
                op = SearchOp(op.namespace_prefix, op.filter, op.offset + op.limit, 0, op.query, op.refresh_ttl)
            elif isinstance(op, ListNamespacesOp):
                op = ListNamespacesOp(match_conditions=None, max_depth=None, limit=10**9, offset=0)
            parts.append(len(kv_ops))
            kv_ops.append(op)
        return kv_ops, parts

    def _memory_queries(self, ops: list[Op]) -> list[str]:
        wanted = [
            op.query
            for op in ops
            if isinstance(op, SearchOp) and op.query and self._reaches_memory(tuple(op.namespace_prefix))
        ]
        return list(dict.fromkeys(wanted))

    def _memory_reads(self, ops: list[Op], qvecs: Mapping[str, Any]) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for i, op in enumerate(ops):
            if isinstance(op, GetOp) and self._owned(tuple(op.namespace)):
                out[i] = self.memory.get(op) if self._has_memory() or self._can_open() else None
            elif isinstance(op, SearchOp) and self._reaches_memory(tuple(op.namespace_prefix)):
                out[i] = self.memory.search(op, qvecs.get(op.query) if op.query else None)
            elif isinstance(op, ListNamespacesOp) and (self._has_memory() or self._can_open()):
                out[i] = self.memory.namespaces()
        return out

    def _memory_writes(self, ops: list[Op]) -> None:
        for op in ops:
            if isinstance(op, PutOp) and self._owned(tuple(op.namespace)):
                self.memory.put(op)

    def _can_open(self) -> bool:
        """Whether a dual memory exists to open (a subclass opens one lazily)."""
        return False

    def _join(self, ops: list[Op], parts: list[int | None], kv_results: list[Any], mem: dict[int, Any]) -> list[Result]:
        results: list[Result] = []
        for i, op in enumerate(ops):
            part = parts[i]
            own = kv_results[part] if part is not None else None
            if isinstance(op, SearchOp) and i in mem:
                results.append(_merged(op, list(own or []), mem[i]))
            elif isinstance(op, ListNamespacesOp):
                results.append(list_namespaces([*(own or []), *mem.get(i, [])], op))
            elif part is None and isinstance(op, GetOp):
                results.append(mem.get(i))
            else:
                results.append(own)
        return results

    # ------------------------------------------------------------------ TTL (the key-value store's)

    def sweep_ttl(self) -> int:
        """Delete expired key-value items; return how many (facts and insights never expire)."""
        sweep = getattr(self.kv, "sweep_ttl", None)
        return int(sweep()) if sweep is not None else 0

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> Any:
        """Start the key-value store's TTL sweeper (see :meth:`LanceKVStore.start_ttl_sweeper`)."""
        start = getattr(self.kv, "start_ttl_sweeper", None)
        return start(sweep_interval_minutes) if start is not None else SweeperFuture.finished()

    def stop_ttl_sweeper(self, timeout: float | None = None) -> Any:
        """Stop the key-value store's TTL sweeper."""
        stop = getattr(self.kv, "stop_ttl_sweeper", None)
        return stop(timeout) if stop is not None else Stopped(True)

    def __enter__(self) -> DualMemStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_ttl_sweeper()

    async def __aenter__(self) -> DualMemStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop_ttl_sweeper()


def _merged(op: SearchOp, kv_items: list[SearchItem], memory: list[SearchItem]) -> list[SearchItem]:
    """Return one page of key-value and memory hits: scored best first then unscored, or newest first without a query."""
    both = [*kv_items, *memory]
    if op.query:
        both.sort(key=lambda it: (it.score is None, -(it.score or 0.0)))
    else:
        both.sort(key=lambda it: (it.updated_at, it.key), reverse=True)
    return both[op.offset : op.offset + op.limit]


class LanceDBStore(DualMemStore):
    """A LangGraph store on LanceDB: key-value items with semantic search and TTL, and the dual memory at the same URI.

    ``index`` indexes key-value items (``{"dims", "embed", "fields"}``, as LangGraph's stores);
    the dual memory embeds with ``embeddings``, else the index's embedder, else the one the
    store records (the embedder ``dualmem ingest`` wrote it with).
    """

    def __init__(
        self,
        uri: str,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        memory_label: str = DEFAULT_LABEL,
        storage_options: Mapping[str, str] | str | None = None,
        dual: DualStore | None = None,
        embeddings: Any = None,
    ) -> None:
        self.uri = str(uri)
        self.storage_options = (
            storage_options if storage_options is not None else getattr(dual, "storage_options", None)
        )
        kv = LanceKVStore(
            self.uri, index=index, ttl=ttl, storage_options=self.storage_options, db=getattr(dual, "_db", None)
        )
        super().__init__(kv, dual, memory_label=memory_label)
        self._embeddings = embeddings if embeddings is not None else (kv.embeddings if index else None)

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, embeddings: Any = None, ttl: TTLConfig | None = None
    ) -> LanceDBStore:
        """Open the store at ``settings.store_uri``, indexing whole values with the settings' embedder."""
        from dualmem.stores.lance import LanceDualStore

        s = Settings.resolve(settings)
        return cls.over(LanceDualStore.from_settings(s, embeddings), ttl=ttl, memory_label=s.memory_label)

    @classmethod
    def over(cls, dual: DualStore, *, ttl: TTLConfig | None = None, memory_label: str = DEFAULT_LABEL) -> LanceDBStore:
        """Return the LangGraph store over a LanceDB ``DualStore`` (its URI, connection and embedder)."""
        index: IndexConfig = {"dims": dual.dims, "embed": dual.embeddings, "fields": ["$"]}
        return cls(dual.uri, index=index, ttl=ttl, memory_label=memory_label, dual=dual)

    def _can_open(self) -> bool:
        from dualmem.stores import lance

        return self._dual is not None or lance.TABLE in lance.L.table_names(self.kv.db)  # type: ignore[attr-defined]

    def _has_memory(self) -> bool:
        return self._can_open()

    def _open_dual(self) -> DualStore:
        from dualmem.stores.lance import LanceDualStore, recorded_embedder

        embeddings = self._embeddings
        if embeddings is None:
            embeddings = recorded_embedder(self.kv.db)  # type: ignore[attr-defined]
        return LanceDualStore(self.uri, embeddings, storage_options=self.storage_options)

    def maintain(self) -> dict[str, int]:
        """Maintain the dual memory and the key-value tables (``dualmem maintain``)."""
        done = dict(self.dual.maintain()) if self._can_open() else {}
        kv = self.kv.maintain()  # type: ignore[attr-defined]
        kv["duplicates_removed"] = kv.get("duplicates_removed", 0) + done.pop("duplicates_removed", 0)
        return {**done, **kv}


def langgraph_view(dual: DualStore) -> DualMemStore:
    """Return the LangGraph store over a dual store: its URI's key-value items and this dual memory (in RAM for an
    in-memory store, whose key-value items live beside it)."""
    from dualmem.stores.lance import LanceDualStore
    from dualmem.stores.memory import InMemoryDualStore

    if isinstance(dual, LanceDualStore):
        return LanceDBStore.over(dual)
    if isinstance(dual, InMemoryDualStore):
        return DualMemStore(dual.kv, dual)
    raise ConfigurationError(f"no LangGraph view of a {type(dual).__name__}; use a LanceDualStore or InMemoryDualStore")


def make_store() -> Any:
    """Return the store ``langgraph dev`` serves (``langgraph.json`` → ``store.path``), built from Settings.

    The ``ttl`` block of ``langgraph.json``'s store config (the server passes it in
    ``LANGGRAPH_STORE``) is honoured, and its sweeper started. Built inside a running event loop (the server builds
    its store so), the ``LanceDBStore`` is wrapped in a :class:`~dualmem.stores.batched.BatchedStore`: the server's
    concurrent store calls become one batch each tick.
    """
    # the server may exec this file as an anonymous module: build the canonical class
    from dualmem.stores.langgraph_store import LanceDBStore as Store

    config = json.loads(os.environ.get("LANGGRAPH_STORE") or "{}")
    store = Store.from_settings(ttl=config.get("ttl") or None)
    if store.ttl_config:
        store.start_ttl_sweeper()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return store  # built outside an event loop: plain
    from dualmem.stores.batched import BatchedStore

    return BatchedStore(store)
