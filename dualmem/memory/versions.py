"""Item versions: the one rule by which a change to a memory item keeps what it replaced.

A change (the writer's UPDATE of a chunk, a put or delete through the LangGraph
store API or the memory tools) is named by a *change id*: the chunk id for the
writer, ``"api:<via>:<random>"`` for other writes. Before an item is rewritten or
deleted, its current state is written as a **version row**: a copy of the item
under the id ``stable_id(item_id, change, "version", prefix="v")``, status
``superseded`` (so retrieval never sees it), with ``meta``:

- ``version_of`` — the id of the item it is a version of;
- ``superseded_by_chunk`` — the change that replaced this state;
- ``deleted_by_chunk`` — the same change, when the change deleted the item.

The rewritten item records ``meta["updated_by_chunk"]`` (the last change that
rewrote it); the writer's DELETE keeps the item itself as a superseded row with
``meta["deleted_by_chunk"]``. Version rows copy the item's ``meta``, so each one
carries the ``updated_by_chunk`` of the change that produced it: versions form a
chain from the item's first state to its current one
(:func:`dualmem.control.history.item_history` reads it back).

Pure: plain dicts in, plain dicts out.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from dualmem.schema import stable_id

VERSION_OF = "version_of"
SUPERSEDED_BY = "superseded_by_chunk"
UPDATED_BY = "updated_by_chunk"
DELETED_BY = "deleted_by_chunk"
API_PREFIX = "api:"  # chunk ids never hold a colon


def version_id(item_id: str, change: str) -> str:
    """Return the id of the version row that keeps ``item_id``'s state replaced by ``change``."""
    return stable_id(item_id, change, "version", prefix="v")


def version_row(item: Mapping[str, Any], item_id: str, change: str, *, deleted: bool = False) -> dict[str, Any]:
    """Return the version row keeping ``item`` (a stored item as a dict) as it was before ``change``."""
    old = dict(item)
    old["id"] = version_id(item_id, change)
    old["status"] = "superseded"
    meta = {**(old.get("meta") or {}), VERSION_OF: item_id, SUPERSEDED_BY: change}
    if deleted:
        meta[DELETED_BY] = change
    old["meta"] = meta
    return old


def new_change(via: str) -> str:
    """Return a fresh change id for a write that is not a writer chunk (``via``: ``store``, a tool's name…)."""
    return f"{API_PREFIX}{via}:{uuid.uuid4().hex[:16]}"


def is_api_change(change: str | None) -> bool:
    """Return True for the change id of a write through the store API or a tool (not a writer chunk)."""
    return bool(change) and str(change).startswith(API_PREFIX)
