"""Nodes of the respond graph (:mod:`dualmem.graphs.respond`): ask the memory framework, answer in character, remember.

The graph never branches on which framework it talks to (the ``framework`` setting, or the context's ``memory``
object). Retrieved items travel through the state as plain dicts (:class:`~dualmem.frameworks.base.RetrievedItem`
fields).

Invariant: a turn builds its memory framework at most once. ``retrieve`` builds
it and renders the items' ``memory_text`` into the state (``memory``), so
``reply`` builds nothing; ``remember`` builds one only for a framework that
ingests in the run (DualMem forms memory in the background and builds none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict
from typing import Annotated, Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from dualmem.auth import whose_memory
from dualmem.chat.pending import EARLIER_MESSAGES, HandedOver, ahand_over, hand_over
from dualmem.chat.runtime import chat_thread, formation_for
from dualmem.context import Context, context_of
from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, MemoryFramework
from dualmem.models.retry import invoke_with_retry
from dualmem.prompts.respond import message_text, render_respond_messages
from dualmem.schema import Persona, Session, Turn, stable_id, utcnow


class RespondInput(TypedDict, total=False):
    """Input of the respond graph: persona, and a query or a last human message."""

    persona: dict[str, Any]
    query: str
    messages: Annotated[list[AnyMessage], add_messages]
    namespace: list[str]
    k: int | None
    mode: str | None
    remember: bool


class RespondState(RespondInput, total=False):
    """State of the respond graph: the input plus the retrieved items and the reply."""

    items: list[dict[str, Any]]
    memory: str  # the items as the framework shows them to the chat model (its memory_text)
    reply: str
    written: list[dict[str, Any]]
    pending: dict[str, Any]


def persona_of(state: RespondState) -> Persona:
    """Return the persona of the graph input."""
    if not state.get("persona"):
        raise ConfigurationError("the respond graph needs `persona` in its input (a Persona as a dict)")
    return Persona.model_validate(state["persona"])


def query_and_history(state: RespondState) -> tuple[str, list[AnyMessage], bool]:
    """Return (query, earlier turns, whether the query is already the last message)."""
    messages = list(state.get("messages") or [])
    if messages and isinstance(messages[-1], HumanMessage):
        return message_text(messages[-1]), messages[:-1], True
    if state.get("query"):
        return state["query"], messages, False
    raise ConfigurationError("the respond graph needs `query` or a last human message in `messages`")


def memory_of(
    ctx: Context, runtime: Runtime[Context] | Any, namespace: tuple[str, ...], persona: Persona
) -> MemoryFramework:
    """Return the context's framework object, or open the ``framework`` setting's on the run's store."""
    if ctx.memory is not None:
        return ctx.memory
    from dualmem.frameworks import open_framework

    store = ctx.dual(getattr(runtime, "store", None))
    fctx = FrameworkContext(
        namespace=(namespace[0], namespace[1]),
        settings=ctx.settings,
        persona=persona,
        chat_model=ctx.llm("chat"),
        writer_model=ctx.llm("writer"),
        embeddings=store.embeddings,
        store_uri=store.uri,
        store=store,
    )
    return open_framework(ctx.settings.evaluation.framework, fctx)


def namespace_of(state: RespondState, ctx: Context, persona: Persona, runtime: Any = None) -> tuple[str, str]:
    """Return the namespace a run reads: (persona id, whose memory by :func:`dualmem.auth.whose_memory`).

    An input ``namespace`` names a persona and a user like any other claim: on a server with authentication a user
    other than the caller is refused, and a persona other than the input's is refused everywhere.
    """
    given = [str(p) for p in state.get("namespace") or []]
    if given and given[0] != persona.id:
        raise ConfigurationError(f"input namespace names persona {given[0]!r} but the input persona is {persona.id!r}")
    user = whose_memory(runtime, claimed=given[1:2], settings=ctx.settings)
    return (persona.id, user)


def retrieve(state: RespondState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Ask the memory framework for the items relevant to the user's message (recent turns as context)."""
    ctx = context_of(runtime)
    query, history, _ = query_and_history(state)
    persona = persona_of(state)
    namespace = namespace_of(state, ctx, persona, runtime)
    if state.get("mode"):
        ctx = ctx.with_(retrieval_mode=state["mode"])
    k = state.get("k") or ctx.settings.tuning.retrieval_k
    turns = ctx.settings.tuning.ranker_context_turns  # messages: the ranker reads who said what
    memory = memory_of(ctx, runtime, namespace, persona)
    items = memory.retrieve(query, k, context=history[-turns:] if turns else [])
    rows = [asdict(i) for i in items]
    return {"query": query, "namespace": list(namespace), "items": rows, "memory": memory.memory_text(items)}


def reply(state: RespondState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Answer in character from the retrieved memory and the recent turns."""
    ctx = context_of(runtime)
    query, history, in_messages = query_and_history(state)
    messages = render_respond_messages(persona_of(state), state.get("memory") or "", query, history)
    # the node's config (callbacks, streaming) flows in implicitly
    answer = invoke_with_retry(ctx.llm("chat"), messages, policy=ctx.settings)
    text = message_text(answer)
    new = [] if in_messages else [HumanMessage(content=query)]
    return {"reply": text, "messages": [*new, AIMessage(content=text, id=getattr(answer, "id", None))]}


def exchange_session(
    persona: Persona, query: str, reply: str, earlier: Sequence[str] | None = None, when: str | None = None
) -> Session:
    """Return one chat exchange as a session (unique id per exchange).

    ``earlier``: the user's previous messages of the chat, kept in ``meta`` for the
    memory-poisoning guard (a request announced there flags this message).
    """
    stamp = utcnow()
    sid = stable_id("chat", persona.id, query, reply, stamp.isoformat(), prefix="chat-")
    return Session(
        id=sid,
        time=when or stamp.date().isoformat(),
        turns=[
            Turn(id=f"{sid}-u", role="user", text=query),
            Turn(id=f"{sid}-a", role="assistant", speaker=persona.name, text=reply),
        ],
        meta={"earlier": list(earlier or [])},
    )


def _earlier(state: RespondState) -> list[str]:
    """Return the user's messages before this query (the memory-poisoning guard's context)."""
    said = [message_text(m) for m in state.get("messages") or [] if isinstance(m, HumanMessage)]
    return (said[:-1] if said and said[-1] == state["query"] else said)[-EARLIER_MESSAGES:]


def _hand_over_args(ctx: Context, runtime: Runtime[Context], state: RespondState) -> tuple[Any, ...]:
    """Return :func:`~dualmem.chat.pending.hand_over`'s arguments for the state's exchange: its turn ids come from the
    ids of the user's message and the reply (a resumed run hands nothing over twice)."""
    messages = list(state.get("messages") or [])
    asked = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    answered = messages[-1] if messages and isinstance(messages[-1], AIMessage) else None
    said = [
        ("user", state["query"], getattr(asked, "id", None)),
        ("assistant", state["reply"], getattr(answered, "id", None)),
    ]
    given = dict(ctx.models or {})  # an injected writer, else the injected chat model unless a writer is set
    writer = given["writer"] if "writer" in given else None if ctx.settings.writer_model else given.get("chat")
    store = getattr(runtime, "store", None)
    return (
        persona_of(state),
        tuple(state["namespace"]),
        chat_thread(runtime),
        ctx.settings,
        store if store is not None else ctx.dual(None),
        said,
        ctx.formation or formation_for(ctx.settings, runtime),
        _earlier(state),
        writer,
    )


def _reported(done: HandedOver) -> dict[str, Any]:
    """Return what the graph reports of a hand-over: the thread, its pending turns and tokens, the guard's flags."""
    return {
        "thread": done.request.thread,
        "turns": len(done.pending.turns),
        "tokens": done.unsealed_tokens,
        "flagged": [dict(f) for f in done.flags],
    }


def _forms_in_background(ctx: Context) -> bool:
    """Whether the run's framework forms memory in the background (a class constant: nothing is built to read it)."""
    from dualmem.frameworks import framework_class

    return (
        ctx.memory if ctx.memory is not None else framework_class(ctx.settings.evaluation.framework)
    ).forms_in_background


def _ingest(state: RespondState, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = context_of(runtime)
    persona = persona_of(state)
    report = memory_of(ctx, runtime, tuple(state["namespace"]), persona).ingest(
        exchange_session(persona, state["query"], state["reply"], _earlier(state))
    )
    return {"written": list(report.meta.get("rows") or [asdict(report)])}


def remember(state: RespondState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Hand the exchange to memory formation (DualMem: pending turns of the thread, written in the background, through
    the one hand-over the chat middleware uses too), else ``ingest`` it."""
    ctx = context_of(runtime)
    if not _forms_in_background(ctx):
        return _ingest(state, runtime)
    return {"written": [], "pending": _reported(hand_over(*_hand_over_args(ctx, runtime, state)))}


async def aremember(state: RespondState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Async :func:`remember` (on the LangGraph server the write run is scheduled in process)."""
    ctx = context_of(runtime)
    if not _forms_in_background(ctx):
        return await asyncio.to_thread(_ingest, state, runtime)
    args = await asyncio.to_thread(_hand_over_args, ctx, runtime, state)  # may open the store
    return {"written": [], "pending": _reported(await ahand_over(*args))}


def route_after_reply(state: RespondState) -> Literal["remember", "__end__"]:
    """Remember the exchange when asked to."""
    return "remember" if state.get("remember") else "__end__"
