"""The respond graph: message → dual-stream retrieval → in-character reply (→ remember).

With ``settings.framework`` other than ``dualmem`` the same graph asks that
framework's ``retrieve`` (and ``ingest`` to remember) and shows its items in
the same reply prompt, so every framework can be chatted with.

``retrieve`` ranks the persona's facts and insights with the ``ranker`` setting
(:mod:`dualmem.retrieval`; the earlier messages are the query's context),
``retrieval_k`` each, or one merged top-k pool with ``retrieval_mode="merged"``
as in the paper, insights expanded with the facts they cite; ``reply`` calls the chat model
through LangChain, so ``graph.stream(..., stream_mode="messages")`` yields its
tokens; with ``remember`` the exchange is written back through the writer.

Input: ``persona`` (dict) and either ``query`` or a last human message in
``messages`` (earlier messages are the recent chat turns). Context: ``Settings``
(or a dict) or :class:`~dualmem.nodes.writer.WriterResources`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, cast

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import MemoryFramework, RetrievedItem
from dualmem.frameworks.respond import items_text
from dualmem.nodes.respond import (
    exchange_session,
    message_text,
    recall_memory,
    remember_exchange,
    reply_messages,
    result_from_state,
    result_to_state,
)
from dualmem.nodes.writer import SettingsContext, WriterResources, resources
from dualmem.prompts.respond import render_respond_messages
from dualmem.retry import invoke_with_retry
from dualmem.schema import MemoryItem, Persona
from dualmem.stores.dual import DualResult, DualStore, ScoredItem


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
    """State of the respond graph: the input plus retrieved memory and the reply."""

    facts: list[dict[str, Any]]
    insights: list[dict[str, Any]]
    merged: list[dict[str, Any]]
    grounding: dict[str, list[dict[str, Any]]]
    items: list[dict[str, Any]]
    reply: str
    written: list[dict[str, Any]]


def _persona(state: RespondState) -> Persona:
    if not state.get("persona"):
        raise ConfigurationError("the respond graph needs `persona` in its input (a Persona as a dict)")
    return Persona.model_validate(state["persona"])


def _query_and_history(state: RespondState) -> tuple[str, list[AnyMessage], bool]:
    """Return (query, earlier turns, whether the query is already the last message)."""
    messages = list(state.get("messages") or [])
    if messages and isinstance(messages[-1], HumanMessage):
        return message_text(messages[-1]), messages[:-1], True
    if state.get("query"):
        return state["query"], messages, False
    raise ConfigurationError("the respond graph needs `query` or a last human message in `messages`")


def _framework(res: WriterResources, namespace: tuple[str, ...], persona: Persona) -> MemoryFramework:
    """Open the baseline named by ``settings.framework`` (anything but dualmem) for this namespace."""
    from dualmem.frameworks import FrameworkContext, open_framework

    s = res.settings
    ns = (namespace[0], namespace[1] if len(namespace) > 1 else s.user_id)
    context = FrameworkContext(namespace=ns, settings=s, persona=persona, chat_model=res.chat(), embeddings=res.embeddings, store_uri=s.store_uri)
    return open_framework(s.framework, context)


def retrieve(state: RespondState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Search facts and insights for the user's message (or ask ``settings.framework``'s retrieve)."""
    res = resources(runtime, role="chat")
    s = res.settings
    query, history, _ = _query_and_history(state)
    persona = _persona(state)
    namespace = tuple(state.get("namespace") or (persona.id, s.user_id))
    k = state.get("k") or s.retrieval_k
    if s.framework != "dualmem":
        items = _framework(res, namespace, persona).retrieve(query, k, context=history)
        empty = result_to_state(DualResult())
        return {"query": query, "namespace": list(namespace), "items": [asdict(i) for i in items], **empty}
    result = recall_memory(res, namespace, query, k=k, mode=state.get("mode") or s.retrieval_mode, context=history)
    return {"query": query, "namespace": list(namespace), "items": [], **result_to_state(result)}


def reply(state: RespondState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Answer in character from the retrieved memory and the recent turns."""
    res = resources(runtime, role="chat")
    query, history, in_messages = _query_and_history(state)
    persona = _persona(state)
    if state.get("items"):
        items = [RetrievedItem(**i) for i in state["items"]]
        messages = render_respond_messages(persona, items_text(items), query, history)
    else:
        messages = reply_messages(persona, result_from_state(dict(state)), query, history)
    answer = invoke_with_retry(res.chat(), messages, policy=res.settings)  # the node's config (callbacks, streaming) flows in implicitly
    text = message_text(answer)
    new = [] if in_messages else [HumanMessage(content=query)]
    return {"reply": text, "messages": [*new, AIMessage(content=text, id=getattr(answer, "id", None))]}


def remember(state: RespondState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Write the exchange back into memory through the writer (or the framework's ingest)."""
    res = resources(runtime, role="chat")
    namespace, persona = tuple(state["namespace"]), _persona(state)
    if res.settings.framework != "dualmem":
        report = _framework(res, namespace, persona).ingest(exchange_session(persona, state["query"], state["reply"]))
        return {"written": [asdict(report)]}
    said = [message_text(m) for m in state.get("messages") or [] if isinstance(m, HumanMessage)]
    earlier = (said[:-1] if said and said[-1] == state["query"] else said)[-4:]  # the user's messages before this one
    rows = remember_exchange(res, namespace, persona, state["query"], state["reply"], earlier)
    return {"written": [dict(r) for r in rows]}


def route_after_reply(state: RespondState) -> Literal["remember", "__end__"]:
    """Remember the exchange when asked to."""
    return "remember" if state.get("remember") else "__end__"


builder = StateGraph(RespondState, context_schema=SettingsContext, input_schema=RespondInput)
builder.add_node("retrieve", retrieve)
builder.add_node("reply", reply)
builder.add_node("remember", remember)
builder.add_edge(START, "retrieve")
builder.add_edge("retrieve", "reply")
builder.add_conditional_edges("reply", route_after_reply, ["remember", END])
builder.add_edge("remember", END)
graph = builder.compile()
graph.name = "respond"


# --------------------------------------------------------------------------- Python API


@dataclass
class Reply:
    """An in-character reply with the memory it used (insights with their grounding facts)."""

    text: str
    facts: list[ScoredItem] = field(default_factory=list)
    insights: list[ScoredItem] = field(default_factory=list)
    grounding: dict[str, list[MemoryItem]] = field(default_factory=dict)
    merged: list[ScoredItem] = field(default_factory=list)
    written: list[dict[str, Any]] = field(default_factory=list)
    items: list[RetrievedItem] = field(default_factory=list)


def _call(
    query: str,
    persona: Persona | dict[str, Any],
    settings: Settings | dict[str, Any] | None,
    model: Any,
    store: DualStore | None,
    embeddings: Any,
    k: int | None,
    mode: str | None,
    history: Sequence[Any] | None,
    remember: bool,
    namespace: Iterable[str] | None,
    writer_model: Any,
) -> tuple[dict[str, Any], WriterResources]:
    from dualmem.models import load_chat_model
    from dualmem.prompts.respond import history_messages

    settings = Settings.resolve(settings)
    who = persona if isinstance(persona, Persona) else Persona.model_validate(persona)
    context = WriterResources(
        settings,
        model=None if model is None else load_chat_model(model, settings, role="chat"),
        store=store if store is not None else DualStore.from_settings(settings, embeddings),
        embeddings=embeddings,
        role="chat",
        writer_model=None if writer_model is None else load_chat_model(writer_model, settings, role="writer"),
    )
    inputs: dict[str, Any] = {
        "persona": who.model_dump(mode="json"),
        "messages": [*history_messages(history), HumanMessage(content=query)],
        "remember": remember,
        "k": k,
        "mode": mode,
    }
    if namespace:
        inputs["namespace"] = list(namespace)
    return inputs, context


def _compiled(context: WriterResources) -> Any:
    """Return the graph compiled with the call's store as ``runtime.store``."""
    from dualmem.stores.langgraph_store import LanceDBStore

    db = context.db()
    return builder.compile(store=LanceDBStore(db.uri, dual=db))


def _reply(out: dict[str, Any]) -> Reply:
    result = result_from_state(out)
    items = [RetrievedItem(**i) for i in out.get("items") or []]
    return Reply(out.get("reply", ""), result.facts, result.insights, result.grounding, result.merged, list(out.get("written") or []), items)


def respond(
    query: str,
    persona: Persona | dict[str, Any],
    *,
    settings: Settings | dict[str, Any] | None = None,
    model: Any = None,
    store: DualStore | None = None,
    embeddings: Any = None,
    k: int | None = None,
    mode: str | None = None,
    history: Sequence[Any] | None = None,
    remember: bool = False,
    namespace: Iterable[str] | None = None,
    writer_model: Any = None,
) -> Reply:
    """Answer ``query`` in character from memory; ``remember`` writes the exchange back."""
    inputs, context = _call(query, persona, settings, model, store, embeddings, k, mode, history, remember, namespace, writer_model)
    return _reply(_compiled(context).invoke(cast(Any, inputs), context=cast(Any, context)))


async def arespond(
    query: str,
    persona: Persona | dict[str, Any],
    *,
    settings: Settings | dict[str, Any] | None = None,
    model: Any = None,
    store: DualStore | None = None,
    embeddings: Any = None,
    k: int | None = None,
    mode: str | None = None,
    history: Sequence[Any] | None = None,
    remember: bool = False,
    namespace: Iterable[str] | None = None,
    writer_model: Any = None,
) -> Reply:
    """Async :func:`respond` (same graph)."""
    inputs, context = _call(query, persona, settings, model, store, embeddings, k, mode, history, remember, namespace, writer_model)
    return _reply(await _compiled(context).ainvoke(cast(Any, inputs), context=cast(Any, context)))
