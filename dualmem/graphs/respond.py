"""The respond graph: message → memory framework's ranked items → in-character reply (→ remember).

Nodes live in :mod:`dualmem.nodes.respond`. ``retrieve`` asks the memory
framework (the ``framework`` setting, DualMem by default: facts and the
persona's insights, each insight with the facts it cites) with the recent
turns as context (DualMem and ``raw-turns`` rank with the ``ranker`` setting,
:mod:`dualmem.retrieval`, which reads them); ``reply`` calls the chat model through LangChain, so
``graph.stream(..., stream_mode="messages")`` yields its tokens; with
``remember`` the exchange is handed to memory formation: for DualMem it joins
the run's thread's pending turns in the store and is written in the
background, a chunk at a time (:mod:`dualmem.chat.formation`); other
frameworks ``ingest`` it. The store is
``runtime.store``: the server's, or the one :func:`respond` compiles with.

Input: ``persona`` (dict) and either ``query`` or a last human message in
``messages`` (earlier messages are the recent chat turns). Context:
:class:`~dualmem.context.Context` (``langgraph dev`` passes a dict of settings,
``user_id`` included).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from typing_extensions import TypedDict, Unpack

from dualmem.auth import whose_memory
from dualmem.config import Settings
from dualmem.context import Context, context_of
from dualmem.frameworks.base import RetrievedItem
from dualmem.nodes.respond import RespondInput, RespondState, aremember, remember, reply, retrieve, route_after_reply
from dualmem.schema import MemoryItem, Persona
from dualmem.stores.results import ScoredItem

builder = StateGraph(RespondState, context_schema=Context, input_schema=RespondInput)
builder.add_node("retrieve", retrieve)
builder.add_node("reply", reply)


def _remember(state: RespondState) -> dict[str, Any]:
    return remember(state, get_runtime(Context))


async def _aremember(state: RespondState) -> dict[str, Any]:
    return await aremember(state, get_runtime(Context))


# one node, two bodies: graph.invoke runs remember, graph.ainvoke (the server) aremember
builder.add_node("remember", RunnableLambda(_remember, afunc=_aremember, name="remember"))
builder.add_edge(START, "retrieve")
builder.add_edge("retrieve", "reply")
builder.add_conditional_edges("reply", route_after_reply, ["remember", END])
builder.add_edge("remember", END)
graph = builder.compile()
graph.name = "respond"


# --------------------------------------------------------------------------- Python API


@dataclass
class Reply:
    """An in-character reply with the memory it used.

    ``items`` are what the framework retrieved; for DualMem (whose items carry the
    stored memory item) ``facts``, ``insights``, ``merged`` and ``grounding`` give the
    facts and insights as stored, each insight's cited facts in ``grounding``.
    """

    text: str
    items: list[RetrievedItem] = field(default_factory=list)
    written: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] = field(default_factory=dict)  # with remember: pending turns, the guard's flags

    @property
    def merged(self) -> list[ScoredItem]:
        """Return the stored facts and insights retrieved, best first."""
        return [
            ScoredItem(MemoryItem.model_validate(i.meta["item"]), i.score) for i in self.items if i.meta.get("item")
        ]

    @property
    def facts(self) -> list[ScoredItem]:
        """Return the retrieved stored facts, best first."""
        return [h for h in self.merged if h.item.kind == "fact"]

    @property
    def insights(self) -> list[ScoredItem]:
        """Return the retrieved stored insights, best first."""
        return [h for h in self.merged if h.item.kind == "insight"]

    @property
    def grounding(self) -> dict[str, list[MemoryItem]]:
        """Return, per retrieved insight id, the facts it cites."""
        return {
            i.id or "": [MemoryItem.model_validate(f) for f in i.meta.get("cited") or []]
            for i in self.items
            if i.kind == "insight"
        }


class RespondOptions(TypedDict, total=False):
    """Keyword options of :func:`respond` and :func:`arespond` (all optional)."""

    settings: Settings | dict[str, Any] | None  # per-run settings (over the environment's)
    model: Any  # the chat model: a "provider:model" string or a model object
    store: Any  # a DualStore or LanceDBStore; default: the store ``settings`` names
    embeddings: Any
    k: int | None  # how many items to retrieve
    mode: str | None
    history: Sequence[Any] | None  # the recent chat turns
    remember: bool  # hand the exchange to memory formation
    namespace: Iterable[str] | None  # default: (persona id, user)
    user: str | None  # whose memory; default: the user_id setting, else the persona's only user with memory
    writer_model: Any
    thread_id: str | None  # names the chat: its pending turns are written together, a chunk at a time
    formation: Any  # where they are written (default: by ``settings.formation``, this process's executor)


def _call(
    query: str,
    persona: Persona | dict[str, Any],
    *,
    settings: Settings | dict[str, Any] | None = None,
    model: Any = None,
    store: Any = None,
    embeddings: Any = None,
    k: int | None = None,
    mode: str | None = None,
    history: Sequence[Any] | None = None,
    remember: bool = False,
    namespace: Iterable[str] | None = None,
    user: str | None = None,
    writer_model: Any = None,
    thread_id: str | None = None,
    formation: Any = None,
) -> tuple[dict[str, Any], Context, Any, dict[str, Any] | None]:
    """Prepare one respond run: its input, context, compiled graph and config (the core both shells run)."""
    from dualmem.models import load_chat_model
    from dualmem.prompts.respond import history_messages
    from dualmem.stores import dual_of, langgraph_view, open_store, users_of

    ctx = context_of(settings)
    models = {}
    if model is not None:
        models["chat"] = load_chat_model(model, ctx.settings, role="chat")
    if writer_model is not None:
        models["writer"] = load_chat_model(writer_model, ctx.settings, role="writer")
    chosen = {**(ctx.models or {}), **models} if models else None
    ctx = context_of(ctx, models=chosen, embeddings=embeddings, formation=formation)  # None: unchanged
    db = dual_of(store) if store is not None else open_store(ctx.settings, embeddings)
    who = Persona.model_validate(persona)
    inputs: dict[str, Any] = {
        "persona": who.model_dump(mode="json"),
        "messages": [*history_messages(history), HumanMessage(content=query)],
        "remember": remember,
        "k": k,
        "mode": mode,
    }
    if not namespace:
        mine = whose_memory(
            claimed=[user], settings=ctx.settings, users=lambda: users_of(db, who.id), persona_id=who.id
        )
        namespace = (who.id, mine)
    inputs["namespace"] = list(namespace)
    config = {"configurable": {"thread_id": thread_id}} if thread_id else None
    return inputs, ctx, builder.compile(store=langgraph_view(db)), config


def _reply(out: dict[str, Any]) -> Reply:
    items = [RetrievedItem(**i) for i in out.get("items") or []]
    return Reply(out.get("reply", ""), items, list(out.get("written") or []), dict(out.get("pending") or {}))


def respond(query: str, persona: Persona | dict[str, Any], **options: Unpack[RespondOptions]) -> Reply:
    """Answer ``query`` in character from memory; ``remember`` hands the exchange to memory formation (see :class:`RespondOptions`)."""
    inputs, ctx, runnable, config = _call(query, persona, **options)
    return _reply(runnable.invoke(cast(Any, inputs), config, context=ctx))


async def arespond(query: str, persona: Persona | dict[str, Any], **options: Unpack[RespondOptions]) -> Reply:
    """Async :func:`respond` (same graph)."""
    inputs, ctx, runnable, config = _call(query, persona, **options)
    return _reply(await runnable.ainvoke(cast(Any, inputs), config, context=ctx))


__all__ = ["Reply", "RespondOptions", "arespond", "builder", "graph", "respond"]
