"""``amem``: A-MEM (Xu et al. 2025, "A-MEM: Agentic Memory for LLM Agents") on LanceDB.

Every session is cut into notes of ``note_tokens`` tokens (default
``Settings.tuning.chunk_tokens``, whole turns). For each new note:

1. *note construction* — the chat model writes its keywords, a one-sentence
   context and tags; the note is embedded as content + context + keywords + tags;
2. *link generation* — the ``link_k`` nearest existing notes are shown to the
   model, which picks the ones to link (links are kept both ways); each shows
   its context, keywords, tags and the first ``neighbour_tokens`` tokens of its
   content (default 256: A-MEM's notes are single interactions, ours whole
   chunks, and five full chunks would make a ~6k-token prompt per note);
3. *memory evolution* — in the same answer the model may refine the new note's
   tags and rewrite the context and tags of neighbours, which are re-embedded.

``retrieve(query, k)`` ranks notes by cosine similarity and returns each hit
followed by its linked neighbours (``meta["via"]`` names the hit), cut to ``k``.
A failed analysis keeps the note (content only) and a failed evolution keeps it
unlinked; both are listed in ``IngestReport.failed_chunks``. Notes are records of
the framework's space (``{uri}/amem``, searched exactly by vector), written one by
one: an interrupted ingest resumes where it stopped, and a session is ingested once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, ask, render_turn, session_chunks, truncate_tokens
from dualmem.prompts.amem import AMEM_ANALYSE, AMEM_EVOLVE, AMEM_NEIGHBOUR, AMEM_SYSTEM
from dualmem.schema import Session, stable_id


class NoteAnalysis(BaseModel):
    """Keywords, context and tags of a new note."""

    keywords: list[str] = Field(default_factory=list, description="3-7 salient keywords")
    context: str = Field(default="", description="one sentence: what the note is about and why it matters")
    tags: list[str] = Field(default_factory=list, description="3-6 broad category tags")


class NeighbourUpdate(BaseModel):
    """A neighbour's new context and tags."""

    label: str = Field(description="the neighbour's label, like M2")
    context: str = Field(description="its new context sentence")
    tags: list[str] = Field(default_factory=list, description="its new tags")


class Evolution(BaseModel):
    """Which neighbours to link, and how the neighbourhood evolves."""

    links: list[str] = Field(default_factory=list, description="labels of the related neighbours (M1, M2…)")
    tags: list[str] = Field(default_factory=list, description="the new note's refined tags (empty: keep)")
    should_evolve: bool = Field(default=False, description="true if some neighbours should change")
    updates: list[NeighbourUpdate] = Field(default_factory=list, description="new context and tags of neighbours")


def embed_text(note: dict[str, Any]) -> str:
    """Return the text a note is embedded from: content, context, keywords and tags."""
    parts = [note["content"], note.get("context", "")]
    if note.get("keywords"):
        parts.append("Keywords: " + ", ".join(note["keywords"]))
    if note.get("tags"):
        parts.append("Tags: " + ", ".join(note["tags"]))
    return "\n".join(p for p in parts if p)


class AMemFramework(MemoryFramework):
    """Keep a linked network of LLM-annotated notes that evolve as new notes arrive."""

    name = "amem"
    description = "A-MEM: notes with keywords/tags/context, links to nearest notes, neighbour evolution"

    def __init__(
        self, context: FrameworkContext, link_k: int = 5, note_tokens: int | None = None, neighbour_tokens: int = 256
    ) -> None:
        super().__init__(context)
        self.link_k, self.neighbour_tokens = link_k, neighbour_tokens
        self.note_tokens = note_tokens or context.settings.tuning.chunk_tokens
        self.space = Space(context, self.name)
        self.namespace = tuple(context.namespace)

    def notes(self) -> list[dict[str, Any]]:
        """Return every note, oldest first."""
        return self.space.records()

    def _ask(self, schema: type[BaseModel], prompt: str, report: IngestReport, label: str) -> Any:
        return ask(
            self.context, schema, [SystemMessage(content=AMEM_SYSTEM), HumanMessage(content=prompt)], report, label
        )

    def ingest(self, session: Session) -> IngestReport:
        """Add the session as notes: annotate, link to nearest notes, evolve neighbours."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, report))

    def _ingest(self, session: Session, report: IngestReport) -> None:
        chunks = session_chunks(session, self.note_tokens)
        seq = self.space.count()
        for index, turns in enumerate(tqdm(chunks, desc=f"amem {session.id}", disable=len(chunks) < 4, leave=False)):
            note_id = stable_id(session.id, index, prefix="n")
            if self.space.get([note_id]):  # written by an earlier (maybe interrupted) run
                continue
            note: dict[str, Any] = {
                "id": note_id,
                "session": session.id,
                "time": session.time,
                "turn_ids": [t.id for t in turns],
                "content": "\n".join(render_turn(t) for t in turns),
                "keywords": [],
                "context": "",
                "tags": [],
                "links": [],
                "seq": seq,
                "evolved": 0,
            }
            changed = self._add_note(note, report)
            self.space.put([note], [embed_text(note)], vectors=[note.pop("vector")])
            self.space.put(changed, [embed_text(n) for n in changed])  # the store re-embeds changed texts only
            seq += 1
            report.items_written += 1

    def _add_note(self, note: dict[str, Any], report: IngestReport) -> list[dict[str, Any]]:
        """Annotate ``note``, link it to its nearest notes and evolve them; return the neighbours changed."""
        when = f" ({note['time']})" if note["time"] else ""
        analysis = self._ask(
            NoteAnalysis, AMEM_ANALYSE.format(time=when, content=note["content"]), report, f"{note['id']}:analyse"
        )
        if analysis is not None:
            note.update(keywords=analysis.keywords, context=analysis.context, tags=analysis.tags)
        embedder = self.space.store.embeddings
        note["vector"] = list(embedder.embed_documents([embed_text(note)])[0])
        nearest = self.space.search(note["vector"], self.link_k)
        if not nearest:
            return []
        labels = {f"M{j + 1}": n for j, (n, _) in enumerate(nearest)}
        shown = "\n".join(
            AMEM_NEIGHBOUR.format(
                label=label,
                content=truncate_tokens(n["content"], self.neighbour_tokens),
                context=n["context"],
                keywords=", ".join(n["keywords"]),
                tags=", ".join(n["tags"]),
            )
            for label, n in labels.items()
        )
        prompt = AMEM_EVOLVE.format(
            content=note["content"],
            context=note["context"],
            keywords=", ".join(note["keywords"]),
            tags=", ".join(note["tags"]),
            neighbours=shown,
        )
        decision = self._ask(Evolution, prompt, report, f"{note['id']}:evolve")
        if decision is None:
            return []
        unknown = [lb for lb in [*decision.links, *(u.label for u in decision.updates)] if lb.strip() not in labels]
        if unknown:
            report.meta.setdefault("unknown_labels", []).extend(unknown)
        changed: dict[str, dict[str, Any]] = {}
        for label in decision.links:
            target = labels.get(label.strip())
            if target is None or target["id"] in note["links"]:
                continue
            note["links"].append(target["id"])
            neighbour = changed.get(target["id"], dict(target))
            neighbour["links"] = (
                [*neighbour["links"], note["id"]] if note["id"] not in neighbour["links"] else neighbour["links"]
            )
            changed[target["id"]] = neighbour
        if decision.tags:
            note["tags"] = decision.tags
        if decision.should_evolve:
            for update in decision.updates:
                target = labels.get(update.label.strip())
                if target is None:
                    continue
                neighbour = changed.get(target["id"], dict(target))
                neighbour.update(
                    context=update.context, tags=update.tags or neighbour["tags"], evolved=neighbour["evolved"] + 1
                )
                neighbour["reembed"] = True
                changed[target["id"]] = neighbour
        if decision.tags:
            note["vector"] = list(embedder.embed_documents([embed_text(note)])[0])
        for n in changed.values():
            n.pop("reembed", None)
        return list(changed.values())

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the best notes, each followed by its linked neighbours, ``k`` in all."""
        hits = self.space.search(query, k)
        linked = {
            n["id"]: n for n in self.space.get(list(dict.fromkeys(link for hit, _ in hits for link in hit["links"])))
        }
        out: list[RetrievedItem] = []
        seen: set[str] = set()
        for hit, score in hits:
            for note, via in [(hit, None), *((linked[link], hit["id"]) for link in hit["links"] if link in linked)]:
                if note["id"] in seen or len(out) >= k:
                    continue
                seen.add(note["id"])
                out.append(self._item(note, score, via))
        return out

    @staticmethod
    def _item(note: dict[str, Any], score: float, via: str | None) -> RetrievedItem:
        text = note["content"] + (f"\nContext: {note['context']}" if note["context"] else "")
        meta = {
            "keywords": note["keywords"],
            "tags": note["tags"],
            "context": note["context"],
            "links": note["links"],
            "turn_ids": note["turn_ids"],
            "time": note["time"],
            "via": via,
        }
        return RetrievedItem(
            text=text, kind="fact", score=float(score), source_session=note["session"], id=note["id"], meta=meta
        )

    def reset(self) -> None:
        """Forget every note of this namespace."""
        self.space.drop()
