"""LanceDB dual store: a facts table and an insights table (contract of DESIGN.md).

Every other view of the store (LangGraph ``BaseStore``, LangChain retriever,
agent tools) is a thin shell over this class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from langchain_core.embeddings import Embeddings

from dualmem.config import Settings
from dualmem.schema import MemoryItem, MemoryKind

SearchMode = Literal["hybrid", "vector", "fts"]
Namespace = tuple[str, ...]


@dataclass
class ScoredItem:
    """A memory item with its search score (higher is better)."""

    item: MemoryItem
    score: float


@dataclass
class DualResult:
    """Facts and insights for one query; each insight expanded with the facts it cites."""

    facts: list[ScoredItem] = field(default_factory=list)
    insights: list[ScoredItem] = field(default_factory=list)
    grounding: dict[str, list[MemoryItem]] = field(default_factory=dict)
    merged: list[ScoredItem] = field(default_factory=list)


class DualStore:
    """Facts and insights in two LanceDB tables with vector, full-text and hybrid search.

    API (stable; the writer, responder and frameworks depend on it):

    - ``DualStore(uri, embeddings)`` / ``DualStore.from_settings(settings, embeddings=None)``
    - ``upsert(items)`` — idempotent by ``id``; embeds ``text``; keeps ``created_at``
      of an existing row, sets ``updated_at``
    - ``get(ids) -> list[MemoryItem]`` (missing ids skipped, order of ``ids`` kept)
    - ``list(namespace, kind=None, status="active", limit=None, newest_first=True)``
    - ``search(namespace, query, kind=None, k=10, mode="hybrid", status="active",
      where=None, since=None, until=None) -> list[ScoredItem]`` — ``where`` is an
      extra SQL filter; ``since``/``until`` filter ``event_time``
    - ``dual_search(namespace, query, k_facts=10, k_insights=10, mode="hybrid",
      merged=False, expand=True) -> DualResult``
    - ``supersede(ids)`` (status -> superseded) and ``delete(ids)`` (hard delete)
    - ``count(namespace, kind=None, status="active") -> int``
    - ``namespaces(prefix=()) -> list[Namespace]``
    - ``drop_namespace(namespace)``
    - chunk ledger for idempotent writers: ``chunk_applied(namespace, chunk_id) -> bool``,
      ``mark_chunk_applied(namespace, chunk_id, payload: str)``
    """

    def __init__(self, uri: str, embeddings: Embeddings) -> None:
        raise NotImplementedError

    @classmethod
    def from_settings(cls, settings: Settings | None = None, embeddings: Embeddings | None = None) -> DualStore:
        """Open the store at ``settings.store_uri`` with the settings' embedder."""
        raise NotImplementedError

    def upsert(self, items: Sequence[MemoryItem]) -> None:
        """Insert or replace items by id."""
        raise NotImplementedError

    def get(self, ids: Sequence[str]) -> list[MemoryItem]:
        """Return the items with these ids."""
        raise NotImplementedError

    def list(
        self,
        namespace: Namespace,
        kind: MemoryKind | None = None,
        status: str | None = "active",
        limit: int | None = None,
        newest_first: bool = True,
    ) -> list[MemoryItem]:
        """List a namespace's items."""
        raise NotImplementedError

    def search(
        self,
        namespace: Namespace,
        query: str,
        kind: MemoryKind | None = None,
        k: int = 10,
        mode: SearchMode = "hybrid",
        status: str | None = "active",
        where: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> list[ScoredItem]:
        """Search one namespace."""
        raise NotImplementedError

    def dual_search(
        self,
        namespace: Namespace,
        query: str,
        k_facts: int = 10,
        k_insights: int = 10,
        mode: SearchMode = "hybrid",
        merged: bool = False,
        expand: bool = True,
    ) -> DualResult:
        """Search facts and insights; expand insights with their cited facts."""
        raise NotImplementedError

    def supersede(self, ids: Sequence[str]) -> None:
        """Mark items superseded (kept for history, hidden from search)."""
        raise NotImplementedError

    def delete(self, ids: Sequence[str]) -> None:
        """Delete items for good."""
        raise NotImplementedError

    def count(self, namespace: Namespace, kind: MemoryKind | None = None, status: str | None = "active") -> int:
        """Count a namespace's items."""
        raise NotImplementedError

    def namespaces(self, prefix: Namespace = ()) -> list[Namespace]:
        """List the namespaces holding items."""
        raise NotImplementedError

    def drop_namespace(self, namespace: Namespace) -> None:
        """Delete every item and ledger row of a namespace."""
        raise NotImplementedError

    def chunk_applied(self, namespace: Namespace, chunk_id: str) -> bool:
        """Return True if the writer already applied ``chunk_id``."""
        raise NotImplementedError

    def mark_chunk_applied(self, namespace: Namespace, chunk_id: str, payload: str = "") -> None:
        """Record that ``chunk_id`` was applied (payload: the update JSON)."""
        raise NotImplementedError
