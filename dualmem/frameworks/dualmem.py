"""``dualmem``: persona-driven dual memory — facts plus the persona's insights grounded in them.

``ingest`` runs the recurrent writer on the session (exactly once: write lease
and chunk ledger); ``retrieve`` ranks with the ``ranker`` setting
(:mod:`dualmem.retrieval`: facts and insights carry their session and time, so
the learned ranker reads them as it reads turns, with the recent conversation as
the query's context) and follows ``settings.tuning.retrieval_mode``: ``dual``
returns ``ceil(k/2)`` facts and ``floor(k/2)`` insights, ``merged`` one top-k
pool of both (the paper's single top-10); with ``emotion_strategy`` the pools
are re-ranked by meaning and emotion (Emotional RAG's C-A/C-M/S-S/S-E). Each
item carries the stored memory item and, for an insight, the facts it cites
(``source_sessions`` lists their sessions); ``memory_text`` shows insights
followed by those facts in the reply prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, cast

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.prompts.respond import format_dual_memory
from dualmem.retrieval.pipeline import Ranker
from dualmem.schema import MemoryItem, Persona, Session
from dualmem.stores.results import DualResult, ScoredItem


class DualMemFramework(MemoryFramework):
    """Write facts and insights through the persona; retrieve both streams."""

    name = "dualmem"
    description = "persona-driven dual memory: facts + the persona's own insights citing them (this project)"
    uses_writer = True
    forms_in_background = True  # a chat's exchanges are written by the write graph's pending mode, a chunk at a time

    def __init__(self, context: FrameworkContext, mode: Literal["merged", "dual"] | None = None) -> None:
        super().__init__(context)
        chosen = mode or context.settings.tuning.retrieval_mode
        if chosen not in ("merged", "dual"):
            raise ValueError(f"mode {chosen!r}: use merged or dual")
        self.mode = cast(Literal["merged", "dual"], chosen)
        self.namespace = tuple(context.namespace)
        self.persona = context.persona or Persona(id=self.namespace[0], name=self.namespace[0])
        self.store = context.memory_store()
        self.ranker = Ranker.from_settings(context.settings)

    def ingest(self, session: Session) -> IngestReport:
        """Run the writer over the session's chunks (chunks applied before, by any writer, are skipped)."""
        [[(_, report)]] = self.ingest_history([session])
        if isinstance(report, Exception):
            raise report
        return report

    def ingest_history(self, sessions: Sequence[Session]) -> Iterator[list[tuple[Session, IngestReport | Exception]]]:
        """Write the sessions in one writer pass (one write lease, one ledger read); yield them together, each with
        its report made of its chunks' rows (or the error that stopped the pass)."""
        from dualmem.writer import write_history
        from dualmem.writer.report import WriteReport, failed_rows

        if not sessions:
            return
        try:
            written = write_history(
                list(sessions),
                self.persona,
                settings=self.context.settings,
                model=self.context.writer(),
                store=self.store,
                namespace=self.namespace,
                progress=False,
            )
        except Exception as exc:  # noqa: BLE001 - reported for each session the pass was writing
            yield [(session, exc) for session in sessions]
            return
        rows = {s.id: [row for row in written.chunks if row["session_id"] == s.id] for s in sessions}
        yield [
            (s, self._report(s.id, WriteReport(written.namespace, rows[s.id], failed_rows(rows[s.id]))))
            for s in sessions
        ]

    @staticmethod
    def _report(session_id: str, report: Any) -> IngestReport:
        return IngestReport(
            session_id=session_id,
            items_written=report.facts_written + report.insights_written,
            failed_chunks=[f["chunk_id"] for f in report.failed_chunks],
            llm_calls=report.llm_calls,
            meta={
                "chunks": len(report.chunks),
                "rejected": report.rejected,
                "prompt_tokens": report.prompt_tokens,
                "errors": {f["chunk_id"]: f.get("error") or "malformed writer output" for f in report.failed_chunks},
                "rows": report.chunks,
            },
        )

    def recall(self, query: str, k: int, *, context: Sequence[Any] | None = None) -> DualResult:
        """Return ``k`` facts and ``k`` insights (``dual``) or one top-``k`` pool (``merged``), insights grounded,
        ranked by the ``ranker`` setting after the conversation ``context``."""
        if not self.context.settings.tuning.emotion_strategy:
            return self.ranker.dual(
                self.store, self.namespace, query, k, k, merged=self.mode == "merged", context=context
            )
        return self._emotion_recall(query, k, context)

    def _emotion_recall(self, query: str, k: int, context: Sequence[Any] | None) -> DualResult:
        from dualmem.writer.emotion import DEFAULT_POOL, check_strategy, rerank, score_emotion

        s = self.context.settings
        check_strategy(s.tuning.emotion_strategy)
        size = max(DEFAULT_POOL, k)
        pool = self.ranker.dual(self.store, self.namespace, query, size, size, context=context)
        scored = score_emotion(self.context.chat(), query, retries=s.tuning.max_retries, policy=s)
        q_emotion = scored.value.vector() if scored.value is not None else None
        embeddings = self.store.embeddings
        q_vector = embeddings.embed_query(query)

        def ranked(hits: Sequence[ScoredItem]) -> list[ScoredItem]:
            if not hits:
                return []
            vectors = embeddings.embed_documents([h.item.text for h in hits])
            order = rerank(s.tuning.emotion_strategy, q_vector, q_emotion, vectors, [h.item.emotion for h in hits], k=k)
            return [ScoredItem(hits[i].item, score) for i, score in order]

        if self.mode == "merged":
            merged = ranked([*pool.facts, *pool.insights])
            facts, insights = (
                [h for h in merged if h.item.kind == "fact"],
                [h for h in merged if h.item.kind == "insight"],
            )
        else:
            merged, facts, insights = [], ranked(pool.facts), ranked(pool.insights)
        grounding = {h.item.id: pool.grounding.get(h.item.id, []) for h in insights}
        return DualResult(facts=facts, insights=insights, grounding=grounding, merged=merged)

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return ``k`` items: the merged pool, or ``ceil(k/2)`` facts and ``floor(k/2)`` insights (``context``: recent turns)."""
        if self.mode == "merged":
            result = self.recall(query, k, context=context)
            hits = result.merged
        else:
            result = self.recall(query, max(1, (k + 1) // 2), context=context)
            hits = sorted([*result.facts, *result.insights[: k // 2]], key=lambda h: -h.score)[:k]
        return [self._item(h, result.grounding.get(h.item.id, [])) for h in hits]

    @staticmethod
    def _item(hit: ScoredItem, cited: list[MemoryItem]) -> RetrievedItem:
        item = hit.item
        sessions = [f.source.session_id for f in cited if f.source.session_id]
        return RetrievedItem(
            text=item.text,
            kind=item.kind,
            score=float(hit.score),
            source_session=item.source.session_id,
            id=item.id,
            source_sessions=list(dict.fromkeys(sessions)),
            meta={
                "turn_ids": list(item.source.turn_ids),
                "chunk_id": item.source.chunk_id,
                "event_time": item.event_time,
                "grounding": list(item.grounding),
                "grounding_texts": [f.text for f in cited],
                "item": item.model_dump(mode="json"),
                "cited": [f.model_dump(mode="json") for f in cited],
            },
        )

    def memory_text(self, items: Sequence[RetrievedItem]) -> str:
        """Render facts, and insights each followed by the facts it rests on (the reply prompt's memory)."""
        stored = [MemoryItem.model_validate(i.meta["item"]) for i in items if i.meta.get("item")]
        grounding = {i.id or "": [MemoryItem.model_validate(f) for f in i.meta.get("cited") or []] for i in items}
        return format_dual_memory(
            [m for m in stored if m.kind == "fact"], [m for m in stored if m.kind == "insight"], grounding
        )

    def reset(self) -> None:
        """Forget every fact, insight and ledger row of this namespace."""
        self.store.drop_namespace(self.namespace)
