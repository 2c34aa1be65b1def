"""Memory tools for agents (langmem-style): search and manage memories in an injected store.

The store is the ``store=`` argument or, when that is None, the store of the
running LangGraph graph (``graph.compile(store=...)``) — never a global. It
may be any LangGraph ``BaseStore`` (values ``{"content": text}``, as langmem
writes them; with a ``LanceDBStore`` and a namespace ``("dualmem", persona,
user, "fact")`` the tools read and write the dual memory itself) or a
``DualStore`` (search returns facts and insights, manage writes facts).
Searches of the dual memory rank with :mod:`dualmem.retrieval` (the ``ranker``
setting, or the tool's ``ranker``); other namespaces use the store's search.
Namespace parts like ``"{persona}"`` are filled from the run's
``config["configurable"]`` (or its ``context``); ``"{user_id}"`` by the one
user rule (:func:`dualmem.auth.whose_memory`: on a server with authentication,
the authenticated user), and dual memory of another user is refused there. ``update`` and ``delete``
only reach memories of the tool's own namespace: another namespace's id is
refused with an error naming it; both keep the replaced state as a version row (history).
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.store.base import BaseStore
from pydantic import Field

from dualmem.auth import server_identity, whose_memory
from dualmem.errors import ConfigurationError
from dualmem.retrieval.pipeline import Ranker
from dualmem.schema import Fact, MemoryKind
from dualmem.stores.contract import DualStore
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.stores.results import ScoredItem
from dualmem.stores.revisions import remove, revise

KINDS: tuple[MemoryKind, ...] = ("fact", "insight")

Action = Literal["create", "update", "delete"]
SEARCH_DESCRIPTION = (
    "Search your long-term memory of this user. Pass a short natural-language query; "
    "returns the most relevant memories with their ids and scores."
)
MAX_LIMIT = 100  # the most memories one search returns to a model
Query = Annotated[str, Field(description="What to look for, in a few words (e.g. 'sleep schedule', 'knee injury').")]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description="How many memories to return at most, best first.")]
Content = Annotated[
    str | None, Field(description="The memory's text, one self-contained statement (needed to create or update).")
]
ActionArg = Annotated[Action, Field(description="create a new memory, or update / delete the one named by id.")]
MemoryId = Annotated[
    str | None, Field(description="The id of the memory to update or delete, as search_memory returned it.")
]
MANAGE_DESCRIPTION = (
    "Create, update or delete a long-term memory about the user. Call it when the user reveals "
    "something worth remembering, or when a stored memory is wrong or outdated (pass its id)."
)


def _runtime_values() -> dict[str, Any]:
    """Return the running graph's context as a dict (empty outside a graph)."""
    from dataclasses import asdict, is_dataclass

    try:
        from langgraph.runtime import get_runtime

        context = get_runtime().context
    except Exception:  # noqa: BLE001 - not inside a graph run
        return {}
    if isinstance(context, dict):
        return context
    return asdict(context) if is_dataclass(context) and not isinstance(context, type) else {}


def resolve_namespace(template: tuple[str, ...] | str, config: RunnableConfig | None) -> tuple[str, ...]:
    """Fill ``{name}`` parts of a namespace template from ``config["configurable"]`` or the run's context."""
    parts = (template,) if isinstance(template, str) else tuple(template)
    configurable = {**_runtime_values(), **((config or {}).get("configurable") or {})}
    out = []
    for part in parts:
        if part.startswith("{") and part.endswith("}"):
            name = part[1:-1]
            if name == "user_id" and server_identity()[0] is not None:  # on a server with auth: the caller, by the rule
                out.append(whose_memory(claimed=[configurable.get("user_id")]))
                continue
            if name not in configurable:
                raise ConfigurationError(
                    f"namespace part {part!r} needs config['configurable'][{name!r}]; pass it when invoking "
                    "the graph or tool, or use a fixed namespace"
                )
            out.append(str(configurable[name]))
        else:
            out.append(part)
    return tuple(out)


def _store(store: BaseStore | DualStore | None) -> BaseStore | DualStore:
    if store is not None:
        return store
    from langgraph.config import get_store

    try:
        found = get_store()
    except (RuntimeError, KeyError) as exc:
        raise ConfigurationError(
            "no memory store: pass store= to the tool factory or call the tool inside a graph compiled "
            "with graph.compile(store=...)"
        ) from exc
    if found is None:
        raise ConfigurationError("the running graph has no store; compile it with graph.compile(store=...)")
    return found


def _exists(target: BaseStore | DualStore, namespace: tuple[str, ...], key: str) -> bool:
    if isinstance(target, DualStore):
        return bool(target.get(namespace, [key]))
    return target.get(namespace, key) is not None


def _dual_target(
    target: BaseStore | DualStore, ns: tuple[str, ...]
) -> tuple[DualStore, tuple[str, ...], tuple[MemoryKind, ...]] | None:
    """Return (dual store, memory namespace, kinds) when ``ns`` names dual memory, else None."""
    from dualmem.auth import authorize_namespace

    if isinstance(target, DualStore):
        return target, authorize_namespace(ns), KINDS
    from dualmem.stores.batched import BatchedStore

    target = target.store if isinstance(target, BatchedStore) else target  # the server's store, batched
    if isinstance(target, LanceDBStore) and len(ns) == 4 and ns[0] == target.memory_label and ns[3] in KINDS:
        return target.dual, authorize_namespace(ns[1:3]), (ns[3],)  # type: ignore[return-value]
    return None


def create_search_memory_tool(
    namespace: tuple[str, ...] | str = ("memories", "{user_id}"),
    *,
    store: BaseStore | DualStore | None = None,
    name: str = "search_memory",
    description: str = SEARCH_DESCRIPTION,
    ranker: Ranker | str | None = None,
) -> StructuredTool:
    """Return a tool that searches memories in ``namespace`` (JSON list of hits); dual memory is ranked by ``ranker``."""
    chosen: list[Ranker] = []

    def _ranker() -> Ranker:
        if not chosen:
            chosen.append(
                ranker if isinstance(ranker, Ranker) else Ranker(ranker) if ranker else Ranker.from_settings()
            )
        return chosen[0]

    def search_memory(query: Query, limit: Limit = 10, config: RunnableConfig = None) -> str:  # type: ignore[assignment]
        """Search long-term memory."""
        target = _store(store)
        ns = resolve_namespace(namespace, config)
        dual = _dual_target(target, ns)
        if dual is not None:
            db, memory_ns, kinds = dual
            ranked: list[ScoredItem] = _ranker().rank(db, memory_ns, query, limit, kinds=kinds)
            hits: list[dict[str, Any]] = [
                {
                    "id": h.item.id,
                    "kind": h.item.kind,
                    "content": h.item.text,
                    "grounding": h.item.grounding,
                    "session_id": h.item.source.session_id,
                    "score": round(h.score, 6),
                }
                for h in ranked
            ]
        elif isinstance(target, BaseStore):
            hits = [
                {"id": i.key, "content": i.value.get("content", i.value.get("text", i.value)), "score": i.score}
                for i in target.search(ns, query=query, limit=limit)
            ]
        return json.dumps(hits, ensure_ascii=False, default=str)

    return StructuredTool.from_function(func=search_memory, name=name, description=description)


def create_manage_memory_tool(
    namespace: tuple[str, ...] | str = ("memories", "{user_id}"),
    *,
    store: BaseStore | DualStore | None = None,
    actions_permitted: tuple[Action, ...] = ("create", "update", "delete"),
    name: str = "manage_memory",
    description: str = MANAGE_DESCRIPTION,
) -> StructuredTool:
    """Return a tool that creates, updates or deletes memories in ``namespace``."""

    def manage_memory(
        content: Content = None,
        action: ActionArg = "create",
        id: MemoryId = None,
        config: RunnableConfig = None,  # type: ignore[assignment]
    ) -> str:
        """Create, update or delete a memory."""
        if action not in actions_permitted:
            raise ValueError(f"action {action!r} is not permitted; use one of {list(actions_permitted)}")
        if action == "create" and id is not None:
            raise ValueError("to change an existing memory use action='update' with its id")
        if action in ("update", "delete") and not id:
            raise ValueError(f"action {action!r} needs the id of the memory to change")
        if action != "delete" and not (content or "").strip():
            raise ValueError(f"action {action!r} needs the memory text in content")
        target = _store(store)
        ns = resolve_namespace(namespace, config)
        key = id or str(uuid.uuid4())
        if action != "create" and not _exists(target, ns, key):
            raise ValueError(f"there is no memory {key!r} in this namespace {ns}; search first and pass one of its ids")
        if isinstance(target, DualStore):  # an update or delete keeps the replaced state as a version row
            old = target.get(ns, [key]) if action != "create" else []
            if action == "delete":
                remove(target, ns, key, via=name)
            elif old:
                revise(
                    target,
                    old[0].model_copy(update={"text": content or "", "meta": {**old[0].meta, "via": name}}),
                    via=name,
                )
            else:
                target.upsert([Fact(id=key, namespace=ns, text=content or "", meta={"via": name})])
        elif action == "delete":
            target.delete(ns, key)
        else:
            target.put(ns, key, {"content": content})
        return f"{action}d memory {key}"

    return StructuredTool.from_function(func=manage_memory, name=name, description=description)
