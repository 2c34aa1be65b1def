"""An item's history, read back from what the store already keeps (no second store).

Every change keeps the state it replaced as a version row (:mod:`dualmem.memory.versions`),
so an item's states are its version rows followed by its current row, chained
by ``updated_by_chunk`` → ``superseded_by_chunk``. :func:`item_history` turns
them into one record per ADD / UPDATE / DELETE, oldest first. Version rows are
``superseded``: retrieval, which reads active items only, never sees them.

A history record (:class:`HistoryRecord`, a plain dict in exports):

==================  =====================================================================
``op``              ``ADD``, ``UPDATE`` or ``DELETE``
``item_id``         the item's id; ``kind``: ``fact`` or ``insight``
``at``              when the change was written (ISO 8601, UTC)
``chunk_id``        the writer chunk that made the change (ADD: the item's source chunk);
                    None for a write through the store API or a tool
``change``          the change id: the chunk id, or ``"api:<via>:<random>"`` (``<via>``: ``store``, a tool's name)
``via``             ``writer`` or ``api`` (the store API, a tool, MCP)
``text_before``     the item's text before the change (None for ADD)
``text_after``      its text after the change (None for DELETE)
``grounding_before``, ``grounding_after``  the fact ids an insight cited before and after
``session_id``, ``turn_ids``  the item's source after the change (before it, for DELETE)
``model_text``      the writer model's own words, when the item is stored in the user's (a request fact)
``version_id``      the row holding the state before the change: a version row, or the item itself for
                    the writer's DELETE (None for ADD)
==================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import TypedDict

from dualmem.errors import ConfigurationError
from dualmem.memory.versions import DELETED_BY, SUPERSEDED_BY, UPDATED_BY, VERSION_OF, is_api_change
from dualmem.schema import MemoryItem
from dualmem.stores.contract import DualStore, Namespace


class HistoryRecord(TypedDict):
    """One ADD / UPDATE / DELETE of an item (see the module docstring for each field)."""

    op: str
    item_id: str
    kind: str
    at: str
    chunk_id: str | None
    change: str | None
    via: str
    text_before: str | None
    text_after: str | None
    grounding_before: list[str]
    grounding_after: list[str]
    session_id: str | None
    turn_ids: list[str]
    model_text: str | None
    version_id: str | None


def _record(
    op: str, item_id: str, before: MemoryItem | None, after: MemoryItem | None, change: str | None, at: Any
) -> HistoryRecord:
    state = after or before
    assert state is not None
    api = is_api_change(change) or (op == "ADD" and not change)
    return HistoryRecord(
        op=op,
        item_id=item_id,
        kind=state.kind,
        at=at.isoformat(),
        chunk_id=None if api else change,
        change=change,
        via="api" if api else "writer",
        text_before=before.text if before else None,
        text_after=after.text if after else None,
        grounding_before=list(before.grounding) if before else [],
        grounding_after=list(after.grounding) if after else [],
        session_id=state.source.session_id,
        turn_ids=list(state.source.turn_ids),
        model_text=state.meta.get("model_text"),
        version_id=before.id if before is not None else None,
    )


def chain(current: MemoryItem | None, versions: Sequence[MemoryItem]) -> list[MemoryItem]:
    """Return an item's states oldest first: its version rows in chain order, then its current row.

    The chain follows ``updated_by_chunk`` (the change that produced a state) to ``superseded_by_chunk`` (the
    change that replaced it); states the chain does not reach (a broken chain) follow by write time.
    """
    by_origin: dict[str | None, list[MemoryItem]] = {}
    for v in sorted(versions, key=lambda v: (v.updated_at, v.id)):
        by_origin.setdefault(v.meta.get(UPDATED_BY), []).append(v)
    ordered: list[MemoryItem] = []
    origin: str | None = None
    while by_origin.get(origin):
        state = by_origin[origin].pop(0)
        ordered.append(state)
        origin = state.meta.get(SUPERSEDED_BY)
    seen = {v.id for v in ordered}
    rest = sorted((v for v in versions if v.id not in seen), key=lambda v: (v.updated_at, v.id))
    return [*ordered, *rest, *([current] if current is not None else [])]


def history_of(item_id: str, current: MemoryItem | None, versions: Sequence[MemoryItem]) -> list[HistoryRecord]:
    """Return the history records of an item from its current row (None once deleted) and its version rows."""
    states = chain(current, versions)
    if not states:
        return []
    first = states[0]
    out = [_record("ADD", item_id, None, first, first.source.chunk_id, first.created_at)]
    for before, after in zip(states, states[1:], strict=False):
        out.append(_record("UPDATE", item_id, before, after, before.meta.get(SUPERSEDED_BY), before.updated_at))
    last = states[-1]
    if last.meta.get(DELETED_BY) and (current is None or current.status == "superseded"):
        out.append(_record("DELETE", item_id, last, None, last.meta.get(DELETED_BY), last.updated_at))
    return out


def versions_in(
    dual: DualStore, namespace: Namespace, item_ids: Sequence[str] | None = None
) -> dict[str, list[MemoryItem]]:
    """Return the version rows of a namespace by the id of the item they are versions of (only ``item_ids``' if given)."""
    wanted = None if item_ids is None else set(item_ids)
    out: dict[str, list[MemoryItem]] = {}
    for item in dual.list(namespace, status="superseded", newest_first=False):
        of = item.meta.get(VERSION_OF)
        if of and (wanted is None or of in wanted):
            out.setdefault(str(of), []).append(item)
    return out


def item_history(dual: DualStore, namespace: Namespace, item_id: str) -> list[HistoryRecord]:
    """Return every ADD / UPDATE / DELETE of an item of ``namespace``, oldest first (see :class:`HistoryRecord`).

    Raises a ConfigurationError naming the fix when the namespace holds no item (nor version) of that id.
    """
    ns = tuple(namespace)
    current = dual.get(ns, [item_id])
    if current and current[0].meta.get(VERSION_OF):
        raise ConfigurationError(
            f"{item_id!r} is a version row of item {current[0].meta[VERSION_OF]!r}; ask for that item's history instead"
        )
    versions = versions_in(dual, ns, [item_id]).get(item_id, [])
    if not current and not versions:
        raise ConfigurationError(
            f"no item {item_id!r} in {ns}; `dualmem inspect --persona {ns[0]} --user {ns[-1]} --all` lists the item ids"
        )
    return history_of(item_id, current[0] if current else None, versions)
