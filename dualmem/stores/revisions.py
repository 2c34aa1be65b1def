"""Writes that keep history: rewrite or delete one memory item, keeping the state it replaced as a version row.

The writer keeps history in its plans (:mod:`dualmem.memory.plan`); every other
write path that changes an existing item — the LangGraph store API
(:mod:`~dualmem.stores.memory_view`), the memory tools — goes through these two
functions, so every path keeps history by one rule (:mod:`dualmem.memory.versions`).
A rewrite that changes neither text, grounding, status nor kind writes no version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dualmem.memory.versions import UPDATED_BY, new_change, version_row
from dualmem.schema import MemoryItem
from dualmem.stores.contract import DeleteItems, DualStore, Namespace, PutItems


def _stored(dual: DualStore, namespace: Namespace, item_id: str) -> tuple[MemoryItem, list[float]] | None:
    """Return the stored item of that id (any status) with its stored vector, or None."""
    rows = dual.scan(namespace, status=None, columns="vectors", ids=[item_id]).to_pylist()
    if not rows:
        return None
    found = dual.get(namespace, [item_id])
    return (found[0], [float(x) for x in rows[0]["vector"]]) if found else None


def _same(a: MemoryItem, b: MemoryItem) -> bool:
    return (a.text, list(a.grounding), a.status, a.kind) == (b.text, list(b.grounding), b.status, b.kind)


def revise(dual: DualStore, item: MemoryItem, *, via: str = "store") -> str | None:
    """Insert or rewrite ``item``; when it replaces a different stored state, keep that state as a version row.

    Returns the change id written on the item (None when nothing was replaced). One put of both rows.
    """
    ns = tuple(item.namespace)
    before = _stored(dual, ns, item.id)
    if before is None or _same(before[0], item):
        dual.upsert([item])
        return None
    old, old_vector = before
    change = new_change(via)
    version = MemoryItem.model_validate(version_row(old.model_dump(mode="json"), old.id, change))
    new = item.model_copy(update={"meta": {**item.meta, UPDATED_BY: change}})
    vector: Sequence[float] = old_vector if new.text == old.text else dual.embeddings.embed_documents([new.text])[0]
    dual.upsert([version, new], [old_vector, vector])
    return change


def remove(dual: DualStore, namespace: Namespace, item_id: str, *, via: str = "store") -> int:
    """Delete an item, keeping its last state as a version row marked deleted; return how many items went (0 or 1)."""
    ns = tuple(namespace)
    before = _stored(dual, ns, item_id)
    if before is None:
        return 0
    old, old_vector = before
    row: dict[str, Any] = version_row(old.model_dump(mode="json"), old.id, new_change(via), deleted=True)
    version = MemoryItem.model_validate(row)
    out = dual.batch([PutItems((version,), (tuple(old_vector),)), DeleteItems(ns, (item_id,))])
    return int(out[1])
