"""``emotional-rag``: Emotional RAG (Huang et al. 2024, arXiv 2410.23041) on LanceDB.

Every session is cut into fragments of ``fragment_tokens`` tokens (default
``Settings.tuning.chunk_tokens``, whole turns). Each fragment is embedded and given
an 8-dimension emotion vector (joy, acceptance, fear, surprise, sadness,
disgust, anger, anticipation; 1–10) scored by the shared chat model through
structured output. At retrieval the query's emotion is scored too and the
fragments are ranked by one of the four strategies of
:mod:`dualmem.writer.emotion` — C-A, C-M, S-S, S-E (the ``strategy`` argument,
else ``Settings.tuning.emotion_strategy``, else C-A). S-S and S-E use a pool of 20.

A fragment whose emotion could not be scored is kept (emotional similarity 0)
and listed in ``IngestReport.failed_chunks``; a query whose emotion could not
be scored is ranked by meaning only (``meta["strategy"] == ""``). Fragments are
records of the framework's space (``{uri}/emotional-rag``, meaning searched on
the namespace's RAM view), written in batches (an interrupted ingest resumes; a
session is ingested once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, record_failure, render_turn, session_chunks
from dualmem.schema import EMOTIONS, Session, stable_id
from dualmem.writer.emotion import DEFAULT_POOL, check_strategy, rerank_scored, score_emotion


class EmotionalRAGFramework(MemoryFramework):
    """Retrieve memory fragments by meaning and mood (Emotional RAG's four strategies)."""

    name = "emotional-rag"
    description = "Emotional RAG: fragments with 8-emotion vectors; C-A / C-M / S-S / S-E retrieval strategies"

    def __init__(
        self,
        context: FrameworkContext,
        strategy: str | None = None,
        pool: int = DEFAULT_POOL,
        fragment_tokens: int | None = None,
    ) -> None:
        super().__init__(context)
        self.strategy = check_strategy(strategy or context.settings.tuning.emotion_strategy or "C-A")
        self.pool = pool
        self.fragment_tokens = fragment_tokens or context.settings.tuning.chunk_tokens
        self.space = Space(context, self.name)
        self.namespace = tuple(context.namespace)
        self._query_emotions: dict[str, list[float] | None] = {}

    def fragments(self) -> list[dict[str, Any]]:
        """Return every stored fragment, oldest first."""
        return self.space.records()

    def ingest(self, session: Session) -> IngestReport:
        """Store the session's fragments with their embeddings and emotion vectors (once per session)."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, report))

    def _ingest(self, session: Session, report: IngestReport) -> None:
        done = {f["id"] for f in self.space.records()}
        seq = len(done)
        chunks = session_chunks(session, self.fragment_tokens)
        model, retries = self.context.chat(), self.context.settings.tuning.max_retries
        pending: list[dict[str, Any]] = []
        for index, turns in enumerate(
            tqdm(chunks, desc=f"emotional-rag {session.id}", disable=len(chunks) < 4, leave=False)
        ):
            frag_id = stable_id(session.id, index, prefix="e")
            if frag_id in done:
                continue
            text = "\n".join(render_turn(t) for t in turns)
            result = score_emotion(model, text, retries=retries, policy=self.context.settings)
            report.llm_calls += result.attempts
            if not result.ok:
                record_failure(report, frag_id, result.error)
            pending.append(
                {
                    "id": frag_id,
                    "session": session.id,
                    "time": session.time,
                    "turn_ids": [t.id for t in turns],
                    "text": text,
                    "emotion": result.value.vector() if result.value is not None else None,
                    "seq": seq,
                }
            )
            seq += 1
            if len(pending) >= 16:
                report.items_written += self._write(pending)
                pending = []
        report.items_written += self._write(pending)

    def _write(self, fragments: list[dict[str, Any]]) -> int:
        self.space.put(fragments, [f["text"] for f in fragments], emotions=[f["emotion"] for f in fragments])
        return len(fragments)

    def query_emotion(self, query: str) -> list[float] | None:
        """Return the query's emotion vector, scored once per query text (None if scoring failed)."""
        if query not in self._query_emotions:
            result = score_emotion(
                self.context.chat(),
                query,
                retries=self.context.settings.tuning.max_retries,
                policy=self.context.settings,
            )
            self._query_emotions[query] = result.value.vector() if result.value is not None else None
        return self._query_emotions[query]

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` fragments best matching the query in meaning and emotion."""
        total = self.space.count()
        if not total:
            return []
        emotion = self.query_emotion(query)
        scored = self.space.search(query, total)  # every fragment's cosine, from the namespace's RAM view
        fragments = [f for f, _ in scored]
        ranked = rerank_scored(
            self.strategy, [s for _, s in scored], emotion, [f["emotion"] for f in fragments], k=k, pool=self.pool
        )
        used = self.strategy if emotion is not None else ""
        return [
            RetrievedItem(
                text=fragments[i]["text"],
                kind="fact",
                score=score,
                source_session=fragments[i]["session"],
                id=fragments[i]["id"],
                meta={
                    "strategy": used,
                    "emotion": dict(zip(EMOTIONS, fragments[i]["emotion"] or [], strict=False)),
                    "turn_ids": fragments[i]["turn_ids"],
                    "time": fragments[i]["time"],
                },
            )
            for i, score in ranked
        ]

    def reset(self) -> None:
        """Forget every fragment of this namespace."""
        self.space.drop()
