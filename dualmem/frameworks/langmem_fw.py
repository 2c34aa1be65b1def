"""``langmem``: the real ``langmem`` library's memory store manager over our LanceDB LangGraph store.

Each chunk of a session (``settings.tuning.chunk_tokens`` tokens, whole turns) is
given, as chat messages, to ``langmem.create_memory_store_manager`` with the
shared chat model: the library searches related memories in the store, asks the
model (through ``trustcall`` tool calls: ``Memory`` to insert, ``PatchDoc`` to
update, ``RemoveDoc`` to delete) and writes the result. The store is the
project's :class:`~dualmem.stores.langgraph_store.LanceDBStore` at
``{uri}/langmem`` with the shared embedder indexing ``content.content`` (any
LangGraph ``BaseStore`` may be passed instead, e.g. ``InMemoryStore``).

Beside the library's memories (namespace ``("langmem", *namespace)``) the
framework keeps a chunk ledger and each memory's source sessions in two sibling
namespaces, so ingest is idempotent, resumes after a restart and ``retrieve``
reports where a memory came from; on the LanceDB store a session is ingested
under the namespace's write lease, so two processes never apply a chunk twice. The library's own default instructions are
used (that is the point of the baseline). The model must support tool calling
(``bind_tools``): the bundled ``local:smollm2`` has one, decoding the calls
under a grammar of the tools' schemas (:mod:`dualmem.models.local`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.store.base import BaseStore, IndexConfig

from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import session_chunks
from dualmem.models import embedding_dims
from dualmem.models.retry import invoke_with_retry
from dualmem.schema import Session, Turn, stable_id


def _message(turn: Turn, time: str | None) -> BaseMessage:
    text = f"[{time}] {turn.text}" if time else turn.text
    return HumanMessage(content=text, id=turn.id) if turn.role == "user" else AIMessage(content=text, id=turn.id)


def _content(value: dict[str, Any]) -> str:
    content = value.get("content", value)
    if isinstance(content, dict):
        content = content.get("content", content)
    return content if isinstance(content, str) else str(content)


class LangMemFramework(MemoryFramework):
    """Extract, update and delete memories with langmem's store manager, one chunk at a time."""

    name = "langmem"
    description = "LangMem library (create_memory_store_manager, trustcall tool calls) over the LanceDB LangGraph store"

    def __init__(self, context: FrameworkContext, store: BaseStore | None = None, query_limit: int = 5) -> None:
        super().__init__(context)
        base = tuple(context.namespace)
        self.memories_ns = ("langmem", *base)
        self.ledger_ns = ("langmem_ledger", *base)
        self.sources_ns = ("langmem_sources", *base)
        self.query_limit = query_limit
        self._store = store
        self._manager: Any = None

    @property
    def store(self) -> BaseStore:
        """Return the LangGraph store (key-value items at ``{uri}/langmem``, in RAM for an in-memory run, unless one was given)."""
        if self._store is None:
            from langgraph.store.memory import InMemoryStore

            from dualmem.stores.kv import LanceKVStore

            embedder = self.context.embedder()
            index: IndexConfig = {"dims": embedding_dims(embedder), "embed": embedder, "fields": ["content.content"]}
            uri = f"{self.context.uri}/{self.name}"
            in_ram = uri.startswith("memory://") or getattr(self.context.store, "uri", "") == "memory://"
            self._store = (
                InMemoryStore(index=index)
                if in_ram
                else LanceKVStore(uri, index=index, storage_options=self.context.settings.store_options)
            )
        return self._store

    def manager(self) -> Any:
        """Return the langmem memory store manager bound to the shared chat model."""
        if self._manager is None:
            from langmem import create_memory_store_manager

            model = self.context.chat()
            if type(model).bind_tools is BaseChatModel.bind_tools:
                raise ConfigurationError(
                    f"the langmem framework needs a chat model with tool calling, and {type(model).__name__} has none; "
                    "set DUALMEM_CHAT_MODEL to a tool-calling model (e.g. vllm:Qwen/Qwen3-4B or openai:gpt-4o-mini)"
                )
            self._manager = create_memory_store_manager(
                model,
                enable_inserts=True,
                enable_deletes=True,
                query_limit=self.query_limit,
                namespace=self.memories_ns,
                store=self.store,
            )
        return self._manager

    def ingest(self, session: Session) -> IngestReport:
        """Give each chunk not yet applied to the library; record provenance and failures."""
        from rich.progress import Progress

        report = IngestReport(session_id=session.id)
        manager = self.manager()
        chunks = session_chunks(session, self.context.settings.tuning.chunk_tokens)
        with self._exclusive(), Progress(transient=True, disable=len(chunks) < 4) as progress:
            task = progress.add_task(f"langmem {session.id}", total=len(chunks))
            for index, turns in enumerate(chunks):
                progress.advance(task)
                chunk_id = stable_id(*self.memories_ns, session.id, index, turns[0].id, turns[-1].id, prefix="c")
                if self.store.get(self.ledger_ns, chunk_id) is not None:
                    continue
                report.llm_calls += 1
                try:
                    request = {"messages": [_message(t, session.time) for t in turns]}
                    puts = invoke_with_retry(manager, request, policy=self.context.settings)
                except ConfigurationError:
                    raise
                except Exception as exc:  # noqa: BLE001 - recorded as a failed chunk, never dropped
                    report.failed_chunks.append(chunk_id)
                    report.meta.setdefault("errors", {})[chunk_id] = " ".join(f"{type(exc).__name__}: {exc}".split())[
                        :300
                    ]
                    continue
                for put in puts:
                    old = self.store.get(self.sources_ns, put["key"])
                    sessions = [s for s in (old.value["sessions"] if old else []) if s != session.id] + [session.id]
                    self.store.put(self.sources_ns, put["key"], {"sessions": sessions, "chunk_id": chunk_id})
                self.store.put(self.ledger_ns, chunk_id, {"session_id": session.id, "keys": [p["key"] for p in puts]})
                report.items_written += len(puts)
        return report

    def _exclusive(self) -> AbstractContextManager[Any]:
        """Hold the namespace's write lease while ingesting (one writer at a time, any process), as every framework does.

        On the LanceDB store the ledger check and the chunk's writes then happen under the lease; another
        ``BaseStore`` given by the caller (e.g. ``InMemoryStore``) lives in one process and needs none.
        """
        from dualmem.stores.kv import LanceKVStore
        from dualmem.stores.leases import Leases

        if not isinstance(self.store, LanceKVStore):
            return nullcontext()
        s = self.context.settings
        return Leases(self.store.db, ttl_s=s.lease_ttl_s, wait_s=s.lease_wait_s).hold(self.memories_ns)

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` memories most similar to ``query`` (the store's semantic search)."""
        hits = self.store.search(self.memories_ns, query=query, limit=k)
        out = []
        for hit in hits:
            source = self.store.get(self.sources_ns, hit.key)
            sessions = source.value["sessions"] if source else []
            out.append(
                RetrievedItem(
                    text=_content(hit.value),
                    kind="fact",
                    score=float(hit.score or 0.0),
                    source_session=sessions[0] if sessions else None,
                    id=hit.key,
                    source_sessions=sessions,
                    meta={"langmem_kind": hit.value.get("kind")},
                )
            )
        return out

    def reset(self) -> None:
        """Delete this namespace's memories, ledger and provenance."""
        for ns in (self.memories_ns, self.ledger_ns, self.sources_ns):
            while keys := [item.key for item in self.store.search(ns, limit=100)]:
                for key in keys:
                    self.store.delete(ns, key)
