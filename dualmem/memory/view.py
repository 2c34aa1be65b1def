"""The writer's working view: a bounded slice of memory shown beside a chunk, with short local ids.

The view holds, per stream, the ``k`` items a search of the chunk text ranks
best, then the ``recent`` items written last, each once, labelled ``F1``…
(facts) and ``I1``… (insights) in that order; an insight shows the labels of
the view facts it cites. Its size does not grow with the memory, so neither
does the writer's prompt.

**Invariant:** the view is a pure function of the store's contents and the
chunk. The search is deterministic (:mod:`dualmem.retrieval.plain`: ties go
to the smaller key), and "written last" is commit order taken from the data:
an item's ``meta["seq"]`` (the number of chunks its namespace had applied when
it was written), then its id — never the wall clock or the order rows come
back from storage. Items written through other APIs have no ``seq`` and count
as the oldest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from typing_extensions import TypedDict

from dualmem.prompts.writer import format_view
from dualmem.schema import MemoryItem


class ViewEntry(TypedDict):
    """One remembered item as the writer sees it (``vector``: its stored vector, for dedup and history)."""

    label: str
    id: str
    text: str
    time: str | None
    cites: list[str]
    item: dict[str, Any]
    vector: list[float]


class View(TypedDict):
    """The working view: facts (F#) and insights (I#)."""

    facts: list[ViewEntry]
    insights: list[ViewEntry]


def empty_view() -> View:
    """Return a view with nothing in it."""
    return View(facts=[], insights=[])


def seqs(meta: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Return each row's commit order from its stored ``meta`` JSON: ``meta["seq"]``, -1 when it has none.

    The one reading of "written last" (the writer's view and training both order by it); read from the stored
    JSON without parsing it, vectorised, as the writer does this for every row of a namespace on every snapshot.
    """
    text = (meta.combine_chunks() if isinstance(meta, pa.ChunkedArray) else meta).fill_null("")
    digits = pc.struct_field(pc.extract_regex(text, r'"seq": (?P<seq>-?\d+)'), "seq")
    return pc.cast(digits, "int64").fill_null(-1).to_numpy(zero_copy_only=False)


def build_view(
    facts: Sequence[MemoryItem], insights: Sequence[MemoryItem], vectors: Mapping[str, Sequence[float]] | None = None
) -> View:
    """Label facts ``F1``… and insights ``I1``… in the order given (an item shown twice keeps its first place)."""
    vecs = vectors or {}
    fact_entries = [
        ViewEntry(
            label=f"F{n}",
            id=f.id,
            text=f.text,
            time=f.event_time,
            cites=[],
            item=f.model_dump(mode="json"),
            vector=[float(x) for x in vecs.get(f.id, [])],
        )
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
            vector=[float(x) for x in vecs.get(i.id, [])],
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


def view_ids(view: View) -> dict[str, str]:
    """Return the store id behind each label of the view (``F1`` -> id)."""
    return {e["label"]: e["id"] for e in [*view["facts"], *view["insights"]]}
