"""LangChain retriever over the dual store: facts and insights as ``Document``s, ranked by the retrieval pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

from dualmem.retrieval.pipeline import Ranker
from dualmem.schema import MemoryItem, MemoryKind
from dualmem.stores import dual_of
from dualmem.stores.contract import DualStore, SearchMode
from dualmem.stores.results import ScoredItem


class DualMemRetriever(BaseRetriever):
    """Retrieve facts and insights of one namespace; insights carry the facts they cite.

    Items are ranked by ``ranker`` (default: the ``ranker`` setting, the learned
    ranker; ``"vector"``, ``"hybrid"`` or ``"fts"`` for a plain store search, or a
    :class:`~dualmem.retrieval.Ranker`). The recent conversation can be passed as
    ``retriever.invoke(query, context=[...turns or messages])``, and the number of
    results as ``retriever.invoke(query, k=3)`` (overrides ``k`` for that call). ``mode`` (``vector``,
    ``hybrid``, ``fts``) is a plain store search, as ``ranker=mode``. ``kind`` limits
    the search to one stream; otherwise ``k`` documents are returned: ⌈k/2⌉ facts
    then ⌊k/2⌋ insights (as ``retrieval_mode="dual"``), or with ``merged=True`` one
    top-``k`` pool over both.
    Each document's metadata holds ``id``, ``kind``, ``namespace``, ``session_id``,
    ``turn_ids``, ``chunk_id``, ``event_time``, ``grounding`` (cited fact ids),
    ``grounding_facts`` (their texts, insights only, when ``expand``), ``status``
    and ``score``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    store: DualStore  # a DualStore, or a store that holds one (LanceDBStore, DualMemStore): its dual memory
    namespace: tuple[str, ...]
    k: int = Field(default=10, ge=0)
    ranker: Any = None  # a dualmem.retrieval.Ranker, a ranker spec, or None (the settings' ranker)
    mode: SearchMode | None = None
    kind: MemoryKind | None = None
    merged: bool = False
    expand: bool = True

    @field_validator("store", mode="before")
    @classmethod
    def _dual_store(cls, value: Any) -> DualStore:
        """Accept the stores users hold: a DualStore, or a LanceDBStore / DualMemStore (their dual memory)."""
        return dual_of(value)

    @field_validator("namespace", mode="before")
    @classmethod
    def _namespace(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str) or not all(isinstance(p, str) for p in value):
            raise ValueError(f"namespace is (persona_id, user_id), a tuple of strings; got {value!r}")
        return tuple(value)

    def _ranker(self) -> Ranker:
        if not isinstance(self.ranker, Ranker):
            spec = self.ranker or self.mode
            self.ranker = Ranker(spec) if spec else Ranker.from_settings()
        return self.ranker

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        context: Sequence[Any] | None = None,
        k: int | None = None,
    ) -> list[Document]:
        from dualmem.auth import authorize_namespace

        authorize_namespace(self.namespace)  # inside a run on a server with authentication: the caller's memory only
        k = _check_k(self.k if k is None else k)
        if k == 0:
            return []
        ranker, store = self._ranker(), dual_of(self.store)
        snap = ranker.snapshots.get(store, self.namespace)  # one version: the documents' grounding is the one ranked
        if self.kind is not None or self.merged:
            kinds: tuple[MemoryKind, ...] = (self.kind,) if self.kind is not None else ("fact", "insight")
            hits = ranker.rank(store, self.namespace, query, k, context=context, kinds=kinds, snapshot=snap)
        else:
            per_kind = ranker.rank_kinds(store, self.namespace, query, (k + 1) // 2, context=context, snapshot=snap)
            hits = [*per_kind["fact"], *per_kind["insight"][: k // 2]]
        insights = [h.item for h in hits if h.item.kind == "insight"]
        grounding = ranker.grounding(store, self.namespace, insights, snapshot=snap) if self.expand else {}
        return [to_document(h, grounding.get(h.item.id)) for h in hits]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        context: Sequence[Any] | None = None,
        k: int | None = None,
    ) -> list[Document]:
        return await asyncio.to_thread(
            self._get_relevant_documents, query, run_manager=run_manager.get_sync(), context=context, k=k
        )


def _check_k(k: Any) -> int:
    """Return ``k`` when it is a whole number >= 0 (0: no documents), else raise naming the fix."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a whole number >= 0 (how many documents to return), got {k!r}")
    return k


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
