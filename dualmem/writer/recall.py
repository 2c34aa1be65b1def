"""Recall the writer's working view: a bounded slice of memory relevant to a chunk.

The view holds at most ``view_k`` facts and ``view_k`` insights found by search
on the chunk text, plus the ``view_recent`` newest of each, shown to the model
with short local ids (``F1``…, ``I1``…) that map back to store ids. Its size
does not grow with the memory, so neither does the writer's prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from typing_extensions import TypedDict

from dualmem.prompts.writer import format_view
from dualmem.schema import MemoryItem
from dualmem.stores.dual import DualStore, Namespace


class ViewEntry(TypedDict):
    """One remembered item as the writer sees it."""

    label: str
    id: str
    text: str
    time: str | None
    cites: list[str]
    item: dict[str, Any]


class View(TypedDict):
    """The working view: facts (F#) and insights (I#)."""

    facts: list[ViewEntry]
    insights: list[ViewEntry]


def empty_view() -> View:
    """Return a view with nothing in it."""
    return View(facts=[], insights=[])


def build_view(facts: Sequence[MemoryItem], insights: Sequence[MemoryItem]) -> View:
    """Label facts ``F1``… and insights ``I1``…; an insight cites the view labels of its facts."""
    fact_entries = [
        ViewEntry(label=f"F{n}", id=f.id, text=f.text, time=f.event_time, cites=[], item=f.model_dump(mode="json"))
        for n, f in enumerate(_unique(facts), start=1)
    ]
    by_id = {e["id"]: e["label"] for e in fact_entries}
    insight_entries = [
        ViewEntry(
            label=f"I{n}",
            id=i.id,
            text=i.text,
            time=i.event_time,
            cites=[by_id[g] for g in i.grounding if g in by_id],
            item=i.model_dump(mode="json"),
        )
        for n, i in enumerate(_unique(insights), start=1)
    ]
    return View(facts=fact_entries, insights=insight_entries)


def _unique(items: Sequence[MemoryItem]) -> list[MemoryItem]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item.id not in seen:
            seen.add(item.id)
            out.append(item)
    return out


def view_text(view: View) -> str:
    """Render a view for the writer's prompt."""
    return format_view(view["facts"], view["insights"])


def recall_view(
    store: DualStore,
    namespace: Namespace,
    text: str,
    *,
    k: int = 8,
    recent: int = 4,
    mode: str = "hybrid",
    embeddings: Embeddings | None = None,
) -> View:
    """Return the view for ``text``: top-``k`` search hits and the ``recent`` newest, per stream.

    The text is embedded once (with ``embeddings``, else the store's) for both streams.
    """
    with store.pinned():  # one look at each table's latest version for all the reads below
        if store.count(namespace) == 0:
            return empty_view()
        vector = None if mode == "fts" or k <= 0 else (embeddings or store.embeddings).embed_query(text)
        streams: dict[str, list[MemoryItem]] = {}
        for kind in ("fact", "insight"):
            found = store.search(namespace, text, kind=kind, k=k, mode=mode, vector=vector) if k > 0 else []  # type: ignore[arg-type]
            hits = [h.item for h in found]
            newest = store.list(namespace, kind=kind, limit=recent, newest_first=True) if recent > 0 else []  # type: ignore[arg-type]
            streams[kind] = hits + newest
    return build_view(streams["fact"], streams["insight"])


def view_labels(view: View) -> dict[str, ViewEntry]:
    """Return every entry of the view by its label."""
    return {e["label"]: e for e in [*view["facts"], *view["insights"]]}
