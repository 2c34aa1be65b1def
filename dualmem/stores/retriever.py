"""LangChain retriever over the dual store: facts and insights as ``Document``s."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from dualmem.schema import MemoryItem, MemoryKind
from dualmem.stores.dual import DualStore, ScoredItem, SearchMode


class DualMemRetriever(BaseRetriever):
    """Retrieve facts and insights of one namespace; insights carry the facts they cite.

    ``kind`` limits the search to one stream; otherwise ``k`` facts then ``k``
    insights are returned, or with ``merged=True`` one top-``k`` pool over both.
    Each document's metadata holds ``id``, ``kind``, ``namespace``, ``session_id``,
    ``turn_ids``, ``chunk_id``, ``event_time``, ``grounding`` (cited fact ids),
    ``grounding_facts`` (their texts, insights only, when ``expand``), ``status``
    and ``score``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    store: DualStore
    namespace: tuple[str, ...]
    k: int = 10
    mode: SearchMode = "hybrid"
    kind: MemoryKind | None = None
    merged: bool = False
    expand: bool = True

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self.kind is not None:
            hits = self.store.search(self.namespace, query, kind=self.kind, k=self.k, mode=self.mode)
            grounding = self._grounding(hits) if self.expand and self.kind == "insight" else {}
            return [to_document(h, grounding.get(h.item.id)) for h in hits]
        res = self.store.dual_search(
            self.namespace, query, k_facts=self.k, k_insights=self.k, mode=self.mode,
            merged=self.merged, expand=self.expand,
        )  # fmt: skip
        hits = res.merged if self.merged else [*res.facts, *res.insights]
        return [to_document(h, res.grounding.get(h.item.id)) for h in hits]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return await asyncio.to_thread(self._get_relevant_documents, query, run_manager=run_manager.get_sync())

    def _grounding(self, hits: list[ScoredItem]) -> dict[str, list[MemoryItem]]:
        return self.store.grounding(self.namespace, [h.item for h in hits])


def to_document(hit: ScoredItem, grounding: list[MemoryItem] | None = None) -> Document:
    """Return a ``Document`` for a scored memory item (metadata: kind, id, source, grounding, score)."""
    item = hit.item
    metadata: dict[str, Any] = {
        "id": item.id,
        "kind": item.kind,
        "namespace": list(item.namespace),
        "session_id": item.source.session_id,
        "turn_ids": list(item.source.turn_ids),
        "chunk_id": item.source.chunk_id,
        "event_time": item.event_time,
        "grounding": list(item.grounding),
        "status": item.status,
        "score": hit.score,
    }
    if item.emotion is not None:
        metadata["emotion"] = list(item.emotion)
    if grounding is not None:
        metadata["grounding_facts"] = [{"id": f.id, "text": f.text} for f in grounding]
    return Document(page_content=item.text, metadata=metadata, id=item.id)
