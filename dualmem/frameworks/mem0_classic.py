"""``mem0-classic``: the Mem0 paper's two-phase memory (arXiv 2504.19413), persona-agnostic, on our store.

For every exchange (a user turn and the assistant turns that follow it):

1. **extraction** — the model sees the running conversation summary, the last
   ``recent_messages`` messages (default 10) and the new exchange, and returns
   candidate facts (:data:`MEM0_EXTRACT`);
2. **update** — for each candidate fact the ``top_s`` (default 10) most similar
   active facts are retrieved (vector search) and shown with short ids; the
   model picks one operation, tool-style (:class:`Mem0Decision`):
   ``ADD`` a new fact, ``UPDATE`` an existing one in place (its old text kept in
   ``meta["history"]``), ``DELETE`` a contradicted one (superseded in the store,
   kept for history, hidden from search) or ``NOOP``. With no stored fact yet
   the fact is added without a model call.

The summary is refreshed every ``summary_every`` exchanges (or sooner once the
messages since the last refresh reach ``settings.tuning.chunk_tokens`` tokens) and at
the end of each session (the paper refreshes it asynchronously), generated
within ``2 * summary_words`` tokens (``max_tokens``); the recent
messages shown to the extractor are capped at ``chunk_tokens`` tokens (newest
kept), since assistant turns can be long. Facts are ``MemoryItem``s
of kind ``fact`` in a :class:`~dualmem.stores.dual.DualStore` at
``{uri}/mem0-classic``; the chunk ledger (one entry per exchange) makes ingest
idempotent, and summary and recent messages persist across restarts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Self, TypeVar

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field, create_model, model_validator

from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, ask, render_turn, truncate_tokens
from dualmem.models.retry import invoke_with_retry
from dualmem.models.tokens import count_tokens
from dualmem.prompts.mem0 import MEM0_EXTRACT, MEM0_EXTRACT_SYSTEM, MEM0_SUMMARY, MEM0_UPDATE, MEM0_UPDATE_SYSTEM
from dualmem.schema import Fact, MemoryItem, Session, SourceRef, Turn, stable_id

T = TypeVar("T", bound=BaseModel)


class Mem0Facts(BaseModel):
    """Candidate facts extracted from the latest exchange."""

    facts: list[str] = Field(default_factory=list, description="short self-contained facts about the user")


class Mem0Decision(BaseModel):
    """One memory operation for a new fact."""

    event: Literal["ADD", "UPDATE", "DELETE", "NOOP"]
    id: str | None = Field(default=None, description="id of the existing memory (UPDATE, DELETE; optional for NOOP)")
    text: str = Field(default="", description="the fact for ADD, the merged new text for UPDATE")


def decision_schema(ids: list[str]) -> type[Mem0Decision]:
    """Return a ``Mem0Decision`` that only accepts the shown ``ids``.

    The ids are a required ``enum`` of the JSON schema, so grammar-constrained or
    strict structured output cannot name another one nor leave it out (as the
    Mem0 paper's update prompt, every answer names a memory; ``ADD`` and ``NOOP``
    ignore it); a model that still does (loose JSON) gets a validation error and
    is asked to repair it.
    """
    shown = tuple(ids)

    class Mem0Decision_(Mem0Decision):
        @model_validator(mode="after")
        def _known_id(self) -> Self:
            if self.event in ("UPDATE", "DELETE") and self.id not in shown:
                raise ValueError(f"{self.event} needs `id` set to one of the shown memory ids {list(shown)}")
            if self.event == "UPDATE" and not self.text.strip():
                raise ValueError("UPDATE needs the merged new `text`")
            return self

    Mem0Decision_.__name__ = Mem0Decision_.__qualname__ = "Mem0Decision"
    if not shown:
        return Mem0Decision_
    known: Any = Literal.__getitem__(shown)  # Literal["0", "1", ...]
    described = Field(
        description="id of the shown memory the operation concerns: the one to UPDATE or DELETE, else the closest one"
    )
    return create_model("Mem0Decision", __base__=Mem0Decision_, __doc__=Mem0Decision.__doc__, id=(known, described))


def exchanges(session: Session) -> list[list[Turn]]:
    """Split a session into exchanges: each user turn with the assistant turns after it."""
    out: list[list[Turn]] = []
    for turn in session.turns:
        if turn.role == "user" or not out:
            out.append([turn])
        else:
            out[-1].append(turn)
    return out


class Mem0ClassicFramework(MemoryFramework):
    """Extract facts per exchange, then ADD / UPDATE / DELETE / NOOP them against similar facts."""

    name = "mem0-classic"
    description = "Mem0 paper algorithm: per-exchange fact extraction, then ADD/UPDATE/DELETE/NOOP vs similar facts"

    def __init__(
        self,
        context: FrameworkContext,
        top_s: int = 10,
        recent_messages: int = 10,
        summary_every: int = 10,
        summary_words: int = 150,
    ) -> None:
        super().__init__(context)
        self.top_s, self.recent_messages = top_s, recent_messages
        self.summary_every, self.summary_words = summary_every, summary_words
        self.namespace = tuple(context.namespace)
        self.space = Space(context, self.name)
        self.store = self.space.store

    # ------------------------------------------------------------------ phases

    def extract(
        self, exchange: list[Turn], session: Session, summary: str, recent: list[str], report: IngestReport, label: str
    ) -> Mem0Facts | None:
        """Return the candidate facts of one exchange (None when the model failed: recorded under ``label``)."""
        prompt = MEM0_EXTRACT.format(
            summary=summary or "(none yet)",
            recent=truncate_tokens("\n".join(recent), self.context.settings.tuning.chunk_tokens, keep="end")
            or "(none)",
            date=session.time or "unknown",
            exchange="\n".join(render_turn(t) for t in exchange),
        )
        messages: list[BaseMessage] = [SystemMessage(content=MEM0_EXTRACT_SYSTEM), HumanMessage(content=prompt)]
        return ask(self.context, Mem0Facts, messages, report, label)

    def decide(self, fact: str, similar: list[MemoryItem], report: IngestReport, label: str) -> Mem0Decision | None:
        """Return the operation for one candidate fact (None when the model failed: recorded under ``label``)."""
        shown = "\n".join(f"{i}: {item.text}" for i, item in enumerate(similar))
        messages: list[BaseMessage] = [
            SystemMessage(content=MEM0_UPDATE_SYSTEM),
            HumanMessage(content=MEM0_UPDATE.format(memories=shown, fact=fact)),
        ]
        schema = decision_schema([str(i) for i in range(len(similar))])
        return ask(self.context, schema, messages, report, label)

    def apply(
        self,
        decision: Mem0Decision,
        fact: str,
        similar: list[MemoryItem],
        source: SourceRef,
        time: str | None,
        key: str,
    ) -> str:
        """Apply one operation to the store; return the event applied."""
        target = (
            similar[int(decision.id)] if decision.event in ("UPDATE", "DELETE") and decision.id is not None else None
        )
        if decision.event == "ADD":
            item = Fact(
                id=stable_id(*self.namespace, key, prefix="m0-"),
                namespace=self.namespace,
                text=(decision.text or fact).strip(),
                source=source,
                event_time=time,
                meta={"framework": self.name, "history": [], "sessions": [source.session_id]},
            )
            self.store.upsert([item])
        elif decision.event == "UPDATE" and target is not None:
            meta = dict(target.meta)
            meta["history"] = [*meta.get("history", []), {"text": target.text, "session_id": source.session_id}]
            meta["sessions"] = [*[s for s in meta.get("sessions", []) if s != source.session_id], source.session_id]
            self.store.upsert(
                [
                    target.model_copy(
                        update={"text": decision.text.strip(), "source": source, "event_time": time, "meta": meta}
                    )
                ]
            )
        elif decision.event == "DELETE" and target is not None:
            self.store.supersede(self.namespace, [target.id])
        return decision.event

    def _summarize(self, summary: str, messages: list[str], report: IngestReport) -> str:
        recent = truncate_tokens("\n".join(messages), 2 * self.context.settings.tuning.chunk_tokens, keep="end")
        prompt = MEM0_SUMMARY.format(summary=summary or "(empty)", messages=recent, max_words=self.summary_words)
        report.llm_calls += 1
        try:  # the answer is cut to ~2 tokens a word anyway: generating more is wasted
            bound = self.context.chat().bind(max_tokens=self.summary_words * 2)
            answer = invoke_with_retry(bound, [HumanMessage(content=prompt)], policy=self.context.settings)
        except ConfigurationError:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded; the old summary stays
            report.meta.setdefault("summary_errors", []).append(" ".join(str(exc).split())[:300])
            return summary
        text = str(answer.content).strip()
        return truncate_tokens(text, self.summary_words * 2) or summary

    # ------------------------------------------------------------------ interface

    def ingest(self, session: Session) -> IngestReport:
        """Run extraction and update on every exchange of the session not yet applied (once per session)."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, report))

    def _ingest(self, session: Session, report: IngestReport) -> None:
        from rich.progress import Progress

        events = {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 0}
        state = self.space.value("context") or {"summary": "", "recent": [], "pending": []}
        parts = exchanges(session)
        with Progress(transient=True, disable=len(parts) < 8) as progress:
            task = progress.add_task(f"mem0 {session.id}", total=len(parts))
            for index, exchange in enumerate(parts):
                progress.advance(task)
                chunk_id = stable_id(*self.namespace, session.id, index, *[t.id for t in exchange], prefix="x")
                if self.store.chunk_applied(self.namespace, chunk_id):
                    continue
                self._exchange(session, exchange, chunk_id, state, report, events)
                lines = [render_turn(t) for t in exchange]
                state["recent"] = (state["recent"] + lines)[-self.recent_messages :]
                state["pending"] = state["pending"] + lines
                budget = self.context.settings.tuning.chunk_tokens
                if (
                    len(state["pending"]) >= 2 * self.summary_every
                    or count_tokens("\n".join(state["pending"])) >= budget
                ):
                    state["summary"], state["pending"] = self._summarize(state["summary"], state["pending"], report), []
                self.space.set_values({"context": state})
        if state["pending"]:
            state["summary"], state["pending"] = self._summarize(state["summary"], state["pending"], report), []
            self.space.set_values({"context": state})
        report.items_written = events["ADD"] + events["UPDATE"] + events["DELETE"]
        report.meta["events"] = events

    def _exchange(
        self,
        session: Session,
        exchange: list[Turn],
        chunk_id: str,
        state: dict,
        report: IngestReport,
        events: dict[str, int],
    ) -> None:
        facts = self.extract(exchange, session, state["summary"], state["recent"], report, chunk_id)
        if facts is None:
            return
        source = SourceRef(session_id=session.id, turn_ids=[t.id for t in exchange], chunk_id=chunk_id)
        for i, fact in enumerate(f.strip() for f in facts.facts):
            if not fact:
                continue
            similar = [
                s.item for s in self.store.search(self.namespace, fact, kind="fact", k=self.top_s, mode="vector")
            ]
            if similar:
                decision = self.decide(fact, similar, report, f"{chunk_id}/fact{i}")
                if decision is None:
                    continue
            else:
                decision = Mem0Decision(event="ADD", text=fact)
            events[self.apply(decision, fact, similar, source, session.time, f"{chunk_id}/{i}")] += 1
        self.store.ledger.mark(self.namespace, chunk_id, "applied", facts.model_dump_json())

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` active facts most similar to ``query`` (vector search, as Mem0)."""
        hits = self.store.search(self.namespace, query, kind="fact", k=k, mode="vector")
        return [
            RetrievedItem(
                text=h.item.text,
                kind="fact",
                score=h.score,
                source_session=h.item.source.session_id,
                id=h.item.id,
                source_sessions=[s for s in h.item.meta.get("sessions", []) if s],
                meta={"history": h.item.meta.get("history", []), "event_time": h.item.event_time},
            )
            for h in hits
        ]

    def reset(self) -> None:
        """Forget every fact, the ledger, the summary and recent messages of this namespace."""
        self.space.drop()
