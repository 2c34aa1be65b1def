"""What the memory browser shows, read fresh from the store on every request: personas, users, a page of items, one
item with its grounding, sources and history, and the product's own ranking for a query.

Pure reads over the store contract (:class:`~dualmem.stores.contract.DualStore`); nothing is cached, so a write by
another process shows on the next page load. Who may see what is decided by the caller (:mod:`dualmem.ui.app`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dualmem.schema import MemoryItem
from dualmem.stores.contract import DualStore, Namespace

PAGE = 50
COLUMNS = ("id", "kind", "text", "status", "session_id", "updated_at", "created_at", "event_time")


@dataclass
class ItemsPage:
    """One page of a namespace's items, newest first, with the counts and filters the page shows."""

    rows: list[dict[str, Any]]
    total: int  # items matching the filters
    counts: dict[str, int]  # active facts, active insights, superseded
    sessions: list[str]
    offset: int
    limit: int = PAGE


@dataclass
class ItemView:
    """One item: itself, what it cites (insight) or the turns it came from (fact), what cites it, its history."""

    item: MemoryItem
    cited: list[MemoryItem] = field(default_factory=list)
    cited_by: list[MemoryItem] = field(default_factory=list)
    said: list[tuple[str, str]] = field(default_factory=list)  # (turn id, "Speaker: text") of a fact's source turns
    history: list[dict[str, Any]] = field(default_factory=list)


def personas(dual: DualStore, visible: Callable[[str], bool]) -> list[dict[str, Any]]:
    """Return each persona with memory of a visible user: id, users and active items."""
    out: dict[str, dict[str, Any]] = {}
    for ns in dual.namespaces(()):
        if len(ns) != 2 or not visible(ns[1]):
            continue
        entry = out.setdefault(ns[0], {"id": ns[0], "users": 0, "active": 0})
        entry["users"] += 1
        entry["active"] += dual.count(ns)
    return sorted(out.values(), key=lambda e: e["id"])


def users(dual: DualStore, persona: str, visible: Callable[[str], bool]) -> list[dict[str, Any]]:
    """Return the visible users of a persona with their active facts and insights."""
    out = []
    for ns in dual.namespaces((persona,)):
        if len(ns) == 2 and ns[0] == persona and visible(ns[1]):
            out.append({"id": ns[1], "facts": dual.count(ns, "fact"), "insights": dual.count(ns, "insight")})
    return out


def items_page(
    dual: DualStore, ns: Namespace, *, kind: str = "", status: str = "active", session: str = "", offset: int = 0
) -> ItemsPage:
    """Return one page of ``ns``'s items, newest first, filtered by kind, status (``all``: any) and session."""
    table = dual.scan(ns, status=None, columns="items")
    table = table.select([c for c in COLUMNS if c in table.column_names])
    counts = {
        "facts": _count(table, kind="fact", status="active"),
        "insights": _count(table, kind="insight", status="active"),
        "superseded": _count(table, status="superseded"),
    }
    sessions = sorted(s for s in pc.unique(table.column("session_id")).to_pylist() if s)
    mask = None
    for column, value in (("kind", kind), ("status", "" if status == "all" else status), ("session_id", session)):
        if value:
            test = pc.equal(table.column(column), value)
            mask = test if mask is None else pc.and_(mask, test)
    if mask is not None:
        table = table.filter(mask)
    table = table.sort_by([("updated_at", "descending"), ("id", "ascending")])
    offset = max(0, min(offset, max(0, table.num_rows - 1)))
    return ItemsPage(table.slice(offset, PAGE).to_pylist(), table.num_rows, counts, sessions, offset)


def _count(table: pa.Table, **equal: str) -> int:
    mask = None
    for column, value in equal.items():
        test = pc.equal(table.column(column), value)
        mask = test if mask is None else pc.and_(mask, test)
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0) if mask is not None else table.num_rows


def item_view(dual: DualStore, ns: Namespace, item_id: str) -> ItemView | None:
    """Return one item with its grounding or source turns, the insights citing it, and its history (None: no such)."""
    from dualmem.control.history import item_history
    from dualmem.errors import ConfigurationError

    found = dual.get(ns, [item_id])
    if not found:
        return None
    item = found[0]
    view = ItemView(item)
    if item.kind == "insight":
        view.cited = dual.grounding(ns, [item]).get(item.id, [])
    else:
        said = (item.meta or {}).get("said") or {}
        view.said = [(t, str(said.get(t, ""))) for t in item.source.turn_ids]
        insights = dual.scan(ns, kind="insight", status=None, columns="items").to_pylist()
        citing = [r["id"] for r in insights if item.id in (r.get("grounding") or [])]
        view.cited_by = dual.get(ns, citing) if citing else []
    try:
        view.history = [dict(r) for r in item_history(dual, ns, item_id)]
    except ConfigurationError:
        view.history = []
    return view


def ranked(dual: DualStore, ns: Namespace, query: str, ranker: Any, k: int) -> list[dict[str, Any]]:
    """Return the product's ranking of ``ns`` for ``query`` (the ``ranker`` setting's), with each item's main features."""
    from dualmem.retrieval.explain import explain

    hits = ranker.rank(dual, ns, query, k)
    why = explain(ranker, dual, ns, query, [h.item.id for h in hits])
    return [{"item": h.item, "score": round(float(h.score), 6), "why": why.get(h.item.id, [])} for h in hits]
