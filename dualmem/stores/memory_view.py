"""The dual memory seen through the LangGraph store API (and so through the server's `/store`).

Namespaces ``("dualmem", persona, user, "fact" | "insight")`` map onto the
``DualStore`` tables at the same URI: an item's key is the memory id and its
value the memory item as JSON (text, source, grounding, status…). Get, search
(hybrid when a query is given, newest first otherwise), put (upsert; the value
needs at least ``text``; insights need ``grounding``) and delete work; the
namespaces appear in ``list_namespaces``.
"""

from __future__ import annotations

from typing import Any

from langgraph.store.base import GetOp, Item, PutOp, SearchItem, SearchOp

from dualmem.errors import ConfigurationError
from dualmem.schema import Fact, Insight, MemoryItem

PREFIX = "dualmem"
KINDS = ("fact", "insight")


def is_memory_namespace(namespace: tuple[str, ...]) -> bool:
    """Return True for namespaces under ``("dualmem", …)``."""
    return bool(namespace) and namespace[0] == PREFIX


def split(namespace: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """Return (memory namespace, kind or None) of a ``("dualmem", …)`` namespace."""
    rest = tuple(namespace[1:])
    if rest and rest[-1] in KINDS:
        return rest[:-1], rest[-1]
    return rest, None


def store_namespace(item: MemoryItem) -> tuple[str, ...]:
    """Return the store-API namespace of a memory item."""
    return (PREFIX, *item.namespace, item.kind)


def _value(item: MemoryItem) -> dict[str, Any]:
    return item.model_dump(mode="json", exclude={"namespace"})


def _item(item: MemoryItem, score: float | None | bool = False) -> Item:
    kwargs: dict[str, Any] = {"namespace": store_namespace(item), "key": item.id, "value": _value(item), "created_at": item.created_at, "updated_at": item.updated_at}
    if score is False:
        return Item(**kwargs)
    return SearchItem(**kwargs, score=score)  # type: ignore[arg-type]


def execute(dual: Any, op: GetOp | SearchOp | PutOp, matches: Any) -> Any:
    """Run one store operation against the dual store; ``matches(value, filter)`` filters values."""
    if isinstance(op, GetOp):
        ns, kind = split(tuple(op.namespace))
        found = [i for i in dual.get([op.key]) if i.namespace == ns and (kind is None or i.kind == kind)]
        return _item(found[0]) if found else None
    if isinstance(op, SearchOp):
        return _search(dual, op, matches)
    _put(dual, op)
    return None


def _search(dual: Any, op: SearchOp, matches: Any) -> list[SearchItem]:
    ns, kind = split(tuple(op.namespace_prefix))
    if not ns:
        return []
    status = None if op.filter and "status" in op.filter else "active"
    want = op.offset + op.limit
    fetch = want * 4 if op.filter else want
    if op.query:
        hits = [(h.item, h.score) for k in ([kind] if kind else KINDS) for h in dual.search(ns, op.query, kind=k, k=fetch, status=status)]
        hits.sort(key=lambda pair: -pair[1])
    else:
        hits = [(i, None) for i in dual.list(ns, kind=kind, status=status, limit=fetch)]
    if op.filter:
        hits = [(i, s) for i, s in hits if matches(_value(i), op.filter)]
    return [_item(i, s) for i, s in hits[op.offset : want]]  # type: ignore[misc]


def _put(dual: Any, op: PutOp) -> None:
    ns, kind = split(tuple(op.namespace))
    if op.value is None:
        dual.delete([op.key])
        return
    if kind is None or not ns:
        raise ConfigurationError(f"memory items go under ('dualmem', persona, user, 'fact'|'insight'); got {op.namespace}")
    value = {k: v for k, v in dict(op.value).items() if k not in {"id", "namespace", "kind"}}
    cls = Fact if kind == "fact" else Insight
    old = dual.get([op.key])
    if old:
        value = {**_value(old[0]), **value, "created_at": old[0].created_at}
        for key in ("id", "kind"):
            value.pop(key, None)
    dual.upsert([cls(id=op.key, namespace=ns, **value)])


def namespaces(dual: Any) -> list[tuple[str, ...]]:
    """Return the store-API namespaces of every memory namespace."""
    return [(PREFIX, *ns, kind) for ns in dual.namespaces() for kind in KINDS]
