"""``memorybank``: MemoryBank (Zhong et al., AAAI 2024) on LanceDB.

Every session is cut into chunks of ``Settings.tuning.chunk_tokens`` tokens. Each
chunk is stored verbatim as a *memory piece*, and the chat model summarises it
into an *event summary* (stored as a memory too) and a note on the user's
personality. After each session the model folds the session's events and
personality notes into a *global summary* and a *user portrait*.

Forgetting curve (Ebbinghaus, as in MemoryBank): a memory's retention is
``R = exp(-t / (S * time_scale))`` where ``t`` is the story time since it was
last recalled and ``S`` its strength (1 when written). Story time is the
session date in days when ``Session.time`` parses (it must hold a year), else one
day per session.
``retrieve`` ranks memories by ``(1 + cosine) / 2 * R``; every memory it returns
is *recalled*: its strength grows by one and its clock resets, so recalled
memories decay slower and old unrecalled ones fall below newer ones.
``profile()`` returns the global summary and the portrait, which ``respond``
always puts in front of the retrieved memories.

State lives in the framework's space (``{uri}/memorybank``) and survives
restarts: memories (with their strengths and clocks) are records searched by
vector, the summary, portrait and story clock are values; a session is
ingested once (re-ingesting it does nothing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, ask, render_turn, session_chunks, truncate_tokens
from dualmem.prompts.memorybank import MEMORYBANK_GLOBAL, MEMORYBANK_SESSION, MEMORYBANK_SYSTEM
from dualmem.schema import Session, stable_id


class SessionDigest(BaseModel):
    """What one chunk of a session says: its events and the user's personality."""

    events: str = Field(description="the events and facts of this part of the session, a few sentences")
    personality: str = Field(default="", description="what it shows about the user's personality and needs")


class GlobalMemory(BaseModel):
    """The updated global summary and user portrait."""

    summary: str = Field(description="global summary of all sessions so far")
    portrait: str = Field(description="the user's overall personality, traits, preferences and needs")


def parse_days(time: str | None) -> float | None:
    """Return ``time`` as days since 1970-01-01 (None when it does not parse)."""
    if not time or not re.search(r"\d{4}", time):  # a year is needed; "Session 3" is no date
        return None
    from dateutil import parser

    try:
        moment = parser.parse(time, fuzzy=True, default=parser.parse("2000-01-01"))
    except (ValueError, OverflowError):
        return None
    return moment.replace(tzinfo=None).timestamp() / 86400.0


def retention(elapsed: float, strength: float, time_scale: float = 1.0) -> float:
    """Return the forgetting-curve retention ``exp(-t / (S * time_scale))``."""
    return math.exp(-max(elapsed, 0.0) / (max(strength, 1e-9) * time_scale))


class MemoryBankFramework(MemoryFramework):
    """Store event summaries and raw pieces with a forgetting curve; keep a global summary and a user portrait."""

    name = "memorybank"
    description = "MemoryBank: event summaries, global summary, user portrait; forgetting-curve retention"

    def __init__(
        self,
        context: FrameworkContext,
        time_scale: float = 1.0,
        reinforce: bool = True,
        summary_words: int = 200,
    ) -> None:
        super().__init__(context)
        self.time_scale = time_scale
        self.reinforce = reinforce
        self.summary_words = summary_words
        self.space = Space(context, self.name)
        self.namespace = tuple(context.namespace)

    # ------------------------------------------------------------------ state

    def meta(self) -> dict[str, Any]:
        """Return the global state: story clock, summary, portrait, sessions done."""
        default = {"clock": 0.0, "summary": "", "portrait": "", "sessions": []}
        return {**default, **(self.space.value("meta") or {})}

    def memories(self) -> list[dict[str, Any]]:
        """Return every stored memory (pieces and event summaries), oldest first."""
        return self.space.records()

    def _advance_clock(self, session: Session, clock: float, first: bool) -> float:
        days = parse_days(session.time)
        if days is None:
            return clock + 1.0
        return days if first else max(clock, days)

    # ------------------------------------------------------------------ ingest

    def _structured(self, schema: type[BaseModel], prompt: str, report: IngestReport, label: str) -> Any:
        return ask(
            self.context,
            schema,
            [SystemMessage(content=MEMORYBANK_SYSTEM), HumanMessage(content=prompt)],
            report,
            label,
        )

    def ingest(self, session: Session) -> IngestReport:
        """Store the session's pieces and event summaries; update the global summary and portrait (once per session)."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, self.meta(), report))

    def _ingest(self, session: Session, meta: dict[str, Any], report: IngestReport) -> None:
        clock = self._advance_clock(session, meta["clock"], first=not meta["sessions"])
        when = f" ({session.time})" if session.time else ""
        chunks = session_chunks(session, self.context.settings.tuning.chunk_tokens)
        records: list[dict[str, Any]] = []
        digests: list[SessionDigest] = []
        for index, turns in enumerate(
            tqdm(chunks, desc=f"memorybank {session.id}", disable=len(chunks) < 4, leave=False)
        ):
            chunk_id = stable_id(session.id, index, prefix="c")
            transcript = "\n".join(render_turn(t) for t in turns)
            base = {"session": session.id, "time": session.time, "clock": clock, "strength": 1.0, "last_recall": clock}
            records.append(
                {
                    **base,
                    "id": stable_id(chunk_id, "piece"),
                    "unit": "piece",
                    "text": transcript,
                    "turn_ids": [t.id for t in turns],
                }
            )
            digest = self._structured(
                SessionDigest, MEMORYBANK_SESSION.format(time=when, transcript=transcript), report, chunk_id
            )
            if digest is None:
                continue
            digests.append(digest)
            records.append(
                {
                    **base,
                    "id": stable_id(chunk_id, "event"),
                    "unit": "event",
                    "text": digest.events,
                    "turn_ids": [t.id for t in turns],
                }
            )
        seq = self.space.count()
        for i, record in enumerate(records):
            record["seq"] = seq + i
        self.space.put(records, [r["text"] for r in records])
        if digests:
            budget = 4 * self.context.settings.tuning.chunk_tokens
            prompt = MEMORYBANK_GLOBAL.format(
                summary=meta["summary"],
                portrait=meta["portrait"],
                time=when,
                events=truncate_tokens(" ".join(d.events for d in digests), budget),
                personality=truncate_tokens(" ".join(d.personality for d in digests if d.personality), budget),
                budget=self.summary_words,
            )
            folded = self._structured(GlobalMemory, prompt, report, f"{session.id}:global")
            if folded is not None:
                meta["summary"], meta["portrait"] = folded.summary, folded.portrait
        meta["clock"] = clock
        meta["sessions"] = [*meta["sessions"], session.id]
        self.space.set_values({"meta": meta})
        report.items_written = len(records)

    # ------------------------------------------------------------------ retrieve

    def score_all(self, query: str) -> list[tuple[dict[str, Any], float, float, float]]:
        """Return ``(memory, score, similarity, retention)`` for every memory, best first (no recall)."""
        total = self.space.count()
        if not total:
            return []
        clock = self.meta()["clock"]
        scored = []
        for memory, sim in self.space.search(query, total):  # every memory's cosine (one product on the RAM view)
            kept = retention(clock - memory["last_recall"], memory["strength"], self.time_scale)
            scored.append((memory, (1.0 + sim) / 2.0 * kept, sim, kept))
        return sorted(scored, key=lambda row: -row[1])

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` memories with the best similarity × retention; recall (strengthen) them."""
        top = self.score_all(query)[:k]
        items = [
            RetrievedItem(
                text=m["text"],
                kind="fact",
                score=score,
                source_session=m["session"],
                id=m["id"],
                meta={
                    "unit": m["unit"],
                    "similarity": sim,
                    "retention": kept,
                    "strength": m["strength"],
                    "turn_ids": m.get("turn_ids", []),
                    "time": m.get("time"),
                },
            )
            for m, score, sim, kept in top
        ]
        if self.reinforce and top:
            clock = self.meta()["clock"]
            recalled = [{**m, "strength": m["strength"] + 1.0, "last_recall": clock} for m, *_ in top]
            self.space.put(recalled, [m["text"] for m in recalled])  # same texts: the stored vectors are kept
        return items

    def profile(self) -> list[RetrievedItem]:
        """Return the user portrait and the global summary (when written) as items."""
        meta = self.meta()
        out = []
        for unit, text in (("portrait", meta["portrait"]), ("global_summary", meta["summary"])):
            if text:
                out.append(
                    RetrievedItem(
                        text=text,
                        kind="insight",
                        score=1.0,
                        id=unit,
                        source_sessions=list(meta["sessions"]),
                        meta={"unit": unit},
                    )
                )
        return out

    def respond(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> str:
        """Answer from the portrait, the global summary and the ``k`` retrieved memories."""
        from dualmem.frameworks.base import answer_from_items

        return answer_from_items(self.context, query, self.profile() + self.retrieve(query, k, context=context))

    def reset(self) -> None:
        """Forget every memory, the summary and the portrait of this namespace."""
        self.space.drop()
