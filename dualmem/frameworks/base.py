"""The one interface every memory framework implements (DualMem and the baselines).

A framework instance serves one memory namespace (persona, user). It ingests
sessions incrementally and retrieves ranked items; ``respond`` is optional
(the default answers in character from what ``retrieve`` returns).
The sync methods are the core; the async ones run them in a worker thread.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel

from dualmem.config import Settings
from dualmem.models.retry import invoke_with_retry
from dualmem.prompts.respond import format_memory_lines, message_text, render_respond_messages
from dualmem.schema import Persona, Session


@dataclass
class RetrievedItem:
    """A ranked memory item, whatever the framework stores."""

    text: str
    kind: str
    score: float
    source_session: str | None = None
    id: str | None = None
    source_sessions: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def sessions(self) -> list[str]:
        """Return every session this item comes from (first the main one)."""
        out = [self.source_session] if self.source_session else []
        return out + [s for s in self.source_sessions if s not in out]


@dataclass
class IngestReport:
    """What one ``ingest`` call did."""

    session_id: str
    items_written: int = 0
    failed_chunks: list[str] = field(default_factory=list)
    llm_calls: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class FrameworkContext:
    """Everything a framework needs: namespace, persona, settings and shared models."""

    namespace: tuple[str, str]
    settings: Settings = field(default_factory=Settings)
    persona: Persona | None = None
    chat_model: BaseChatModel | None = None
    embeddings: Embeddings | None = None
    store_uri: str | None = None
    store: Any = None  # the run's memory store (a DualStore): DualMem keeps its facts and insights there
    writer_model: BaseChatModel | None = None
    _stores: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._chat_given = (
            self.chat_model is not None
        )  # a given chat model also writes unless writer_model names another

    def memory_store(self) -> Any:
        """Return the run's DualMem store: the given one, else the one at ``uri`` (opened once per context)."""
        if self.store is None:
            self.store = self._open(self.uri)
        return self.store

    def open_store(self, name: str) -> Any:
        """Return the store of the framework ``name`` at ``{uri}/{name}`` (opened once per context; in RAM when the
        run's store is)."""
        if name not in self._stores:
            self._stores[name] = self._open(f"{self.uri.rstrip('/')}/{name}")
        return self._stores[name]

    def _open(self, uri: str) -> Any:
        from dualmem.stores import InMemoryDualStore, LanceDualStore

        if uri.startswith("memory://") or isinstance(self.store, InMemoryDualStore):
            return InMemoryDualStore(self.embedder())
        return LanceDualStore(uri, self.embedder(), storage_options=self.settings.store_options)

    def chat(self) -> BaseChatModel:
        """Return the shared chat model (built from the settings if not given)."""
        from dualmem.models import load_chat_model

        if self.chat_model is None:
            self.chat_model = load_chat_model(None, self.settings)
        return self.chat_model

    def writer(self) -> BaseChatModel:
        """Return the model that writes memory: the given writer, else the ``writer`` setting's (``writer_model``, else the
        chat model's writer: ``local:smollm2`` writes with its adapter), except that a given chat model also writes."""
        from dualmem.models import load_chat_model

        if self.writer_model is None:
            spec = self.settings.writer_for(chat_given=self._chat_given)
            self.writer_model = self.chat() if spec is None else load_chat_model(spec, self.settings)
        return self.writer_model

    def embedder(self) -> Embeddings:
        """Return the shared embedder (built from the settings if not given)."""
        from dualmem.models import load_embeddings

        if self.embeddings is None:
            self.embeddings = load_embeddings(None, self.settings)
        return self.embeddings

    @property
    def uri(self) -> str:
        """Return the LanceDB URI this framework writes to."""
        return self.store_uri or self.settings.store_uri


class MemoryFramework(ABC):
    """Incremental ingest per session; ranked retrieval; optional in-character reply."""

    name: ClassVar[str]
    description: ClassVar[str]
    uses_writer: ClassVar[bool] = False  # ingest calls the writer model (``writer_model``), not only the chat model
    forms_in_background: ClassVar[bool] = (
        False  # chat exchanges join pending turns, written a chunk at a time (dualmem.chat)
    )

    def __init__(self, context: FrameworkContext) -> None:
        self.context = context

    @abstractmethod
    def ingest(self, session: Session) -> IngestReport:
        """Add one session to memory (sessions arrive in time order)."""

    def ingest_history(self, sessions: Sequence[Session]) -> Iterator[list[tuple[Session, IngestReport | Exception]]]:
        """Add sessions to memory in time order, yielding the sessions done together, each with its report (or the
        error that stopped it). The default ingests them one by one; a framework that writes a whole history in one
        pass (``dualmem``: one write lease and one ledger read for the history, as ``dualmem ingest`` writes it)
        yields them all once it is written."""
        for session in sessions:
            try:
                report = self.ingest(session)
            except Exception as exc:  # noqa: BLE001 - reported for this session; the next ones go on
                yield [(session, exc)]
            else:
                yield [(session, report)]

    @abstractmethod
    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` best memory items for ``query``, best first.

        ``context``: the recent turns of the conversation the query comes from
        (oldest first; strings, dataset turns, LangChain messages or role/content
        dicts, as :func:`dualmem.retrieval.context.context_turns` reads them), for
        frameworks whose ranking uses them (``dualmem``, ``raw-turns``).
        """

    def memory_text(self, items: Sequence[RetrievedItem]) -> str:
        """Render retrieved items as the memory block of the reply prompt."""
        return items_text(items)

    def respond(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> str:
        """Answer ``query`` in character from the memory ``retrieve`` ranks for it (with the same ``context``)."""
        return answer_from_memory(self.context, query, self.memory_text(self.retrieve(query, k, context=context)))

    def reset(self) -> None:
        """Forget everything of this namespace (optional)."""
        raise NotImplementedError(f"{self.name} cannot reset its memory")

    async def aingest(self, session: Session) -> IngestReport:
        """Async ``ingest`` (same core, in a worker thread)."""
        return await asyncio.to_thread(self.ingest, session)

    async def aretrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Async ``retrieve`` (same core, in a worker thread)."""
        return await asyncio.to_thread(self.retrieve, query, k, context=context)

    async def arespond(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> str:
        """Async ``respond`` (same core, in a worker thread)."""
        return await asyncio.to_thread(self.respond, query, k, context=context)


# --------------------------------------------------------------------------- the generic in-character reader
# One prompt (dualmem.prompts.respond) and one chat model for all frameworks' default
# ``respond``, so an evaluation compares memories, not prompts.


def items_text(items: Sequence[RetrievedItem]) -> str:
    """Render retrieved items as the memory block of the reply prompt."""
    return format_memory_lines([{"text": i.text, "kind": i.kind, "session": i.source_session} for i in items])


def answer_from_memory(context: FrameworkContext, query: str, memory: str) -> str:
    """Answer ``query`` in character (``context.persona``) from a rendered memory block with the shared chat model."""
    messages = render_respond_messages(context.persona, memory, query)
    return message_text(invoke_with_retry(context.chat(), messages, policy=context.settings))


def answer_from_items(context: FrameworkContext, query: str, items: Sequence[RetrievedItem]) -> str:
    """Answer ``query`` in character from retrieved items (rendered generically)."""
    return answer_from_memory(context, query, items_text(items))
