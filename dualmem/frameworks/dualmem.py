"""``dualmem``: persona-driven dual memory — facts plus the persona's insights grounded in them.

``ingest`` runs the recurrent writer on the session (chunk ledger: re-ingesting
is a no-op); ``retrieve`` ranks with the ``ranker`` setting (:mod:`dualmem.retrieval`:
facts and insights carry their session and time, so the learned ranker reads
them as it reads turns) and follows ``settings.retrieval_mode``: ``dual``
returns ``ceil(k/2)`` facts and ``floor(k/2)`` insights, ``merged`` one top-k
pool of both (the paper's single top-10); an insight's ``source_sessions``
lists the sessions of the facts it cites. ``respond`` is the
respond core (facts, insights and their grounding in the prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.retrieval.pipeline import Ranker
from dualmem.schema import MemoryItem, Persona, Session
from dualmem.stores.dual import DualStore, ScoredItem


class DualMemFramework(MemoryFramework):
    """Write facts and insights through the persona; retrieve both streams."""

    name = "dualmem"
    description = "persona-driven dual memory: facts + the persona's own insights citing them (this project)"

    def __init__(self, context: FrameworkContext, mode: Literal["merged", "dual"] | None = None) -> None:
        super().__init__(context)
        chosen = mode or context.settings.retrieval_mode
        if chosen not in ("merged", "dual"):
            raise ValueError(f"mode {chosen!r}: use merged or dual")
        self.mode = cast(Literal["merged", "dual"], chosen)
        self.namespace = tuple(context.namespace)
        self.persona = context.persona or Persona(id=self.namespace[0], name=self.namespace[0])
        self.store = DualStore(context.uri, context.embedder())
        self.ranker = Ranker.from_settings(context.settings)

    def _writer(self) -> Any:
        from dualmem.models import load_chat_model

        settings = self.context.settings
        return load_chat_model(None, settings, role="writer") if settings.writer_model else self.context.chat()

    def ingest(self, session: Session) -> IngestReport:
        """Run the writer over the session's chunks (already applied chunks are skipped)."""
        from dualmem.graphs.write import write_history

        report = write_history(
            [session], self.persona, settings=self.context.settings, model=self._writer(), store=self.store,
            embeddings=self.context.embedder(), namespace=self.namespace, progress=False, checkpointer=False,
        )
        return IngestReport(
            session_id=session.id,
            items_written=report.facts_written + report.insights_written,
            failed_chunks=[f["chunk_id"] for f in report.failed_chunks],
            llm_calls=report.llm_calls,
            meta={
                "chunks": len(report.chunks), "rejected": report.rejected, "prompt_tokens": report.prompt_tokens,
                "errors": {f["chunk_id"]: f.get("error") or "malformed writer output" for f in report.failed_chunks},
            },
        )

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return ``k`` items: the merged pool or half facts, half insights (``retrieval_mode``)."""
        from dualmem.nodes.respond import recall_memory
        from dualmem.nodes.writer import WriterResources

        res = WriterResources(self.context.settings, model=self.context.chat_model, store=self.store, embeddings=self.context.embedder(), role="chat")
        if self.mode == "merged":
            result = recall_memory(res, self.namespace, query, k=k, mode="merged", context=context, ranker=self.ranker)
            hits = result.merged
        else:
            result = recall_memory(res, self.namespace, query, k=max(1, (k + 1) // 2), mode="dual", context=context, ranker=self.ranker)
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
            },
        )

    def respond(self, query: str, k: int = 10) -> str:
        """Answer in character with the respond core (insights shown with their facts)."""
        from dualmem.graphs.respond import respond

        mode = "merged" if self.mode == "merged" else "dual"
        reply = respond(
            query, self.persona, settings=self.context.settings, model=self.context.chat(), store=self.store,
            k=k, mode=mode, namespace=self.namespace,
        )
        return reply.text

    def reset(self) -> None:
        """Forget every fact, insight and ledger row of this namespace."""
        self.store.drop_namespace(self.namespace)
