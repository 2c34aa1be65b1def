"""Memory stores: one contract (:class:`DualStore`), two backends, and the LangGraph store views.

- :class:`DualStore` — the store contract of the dual memory (``batch``/``abatch`` of
  :mod:`~dualmem.stores.contract` operations, leases and ledger for exactly-once writing);
- :class:`InMemoryDualStore` — in RAM (tests, notebooks, training, trying DualMem without a disk);
- :class:`LanceDualStore` — LanceDB on a local folder or object storage, shared by many processes;
- :class:`LanceDBStore`, :class:`DualMemStore` — LangGraph ``BaseStore`` views: key-value items
  plus the dual memory under ``memory_namespace(persona, user, kind)``;
- :func:`open_store` — the dual store the settings name (``store_uri``; ``memory://`` is in RAM).

The LangChain retriever and the memory tools rank memory, so they live in :mod:`dualmem.retrieval`.
"""

from __future__ import annotations

from typing import Any

from dualmem.stores.contract import DualStore, Namespace
from dualmem.stores.lance import LanceDualStore
from dualmem.stores.langgraph_store import DualMemStore, LanceDBStore, langgraph_view, make_store
from dualmem.stores.memory import InMemoryDualStore
from dualmem.stores.memory_view import memory_namespace
from dualmem.stores.results import DualResult, ScoredItem

MEMORY_URI = "memory://"


def open_store(settings: Any = None, embeddings: Any = None) -> DualStore:
    """Return the dual store at ``settings.store_uri`` (``memory://``: a fresh in-memory store) with the settings'
    embedder (or ``embeddings``)."""
    from dualmem.config import Settings
    from dualmem.models import load_embeddings

    s = Settings.resolve(settings)
    if s.store_uri.rstrip("/") in (MEMORY_URI.rstrip("/"), ":memory:"):
        return InMemoryDualStore(load_embeddings(embeddings, s), lease_wait_s=s.lease_wait_s)
    return LanceDualStore.from_settings(s, embeddings)


def users_of(store: DualStore, persona_id: str) -> list[str]:
    """Return the users of whom ``persona_id`` has memory in ``store``."""
    return sorted({ns[1] for ns in store.namespaces((persona_id,)) if len(ns) == 2})


def dual_of(store: Any) -> DualStore:
    """Return the dual store behind ``store``: a ``DualStore`` itself, or the one a ``DualMemStore`` shows."""
    from dualmem.errors import ConfigurationError

    if isinstance(store, DualStore):
        return store
    if isinstance(store, DualMemStore):
        return store.dual
    inner = getattr(store, "store", None)  # a BatchedStore over a DualMemStore
    if isinstance(inner, DualMemStore):
        return inner.dual
    raise ConfigurationError(
        f"DualMem needs its memory store, got {type(store).__name__}; pass a DualStore (open_store(settings)) "
        "or a LanceDBStore / DualMemStore"
    )


__all__ = [
    "MEMORY_URI",
    "DualMemStore",
    "DualResult",
    "DualStore",
    "InMemoryDualStore",
    "LanceDBStore",
    "LanceDualStore",
    "Namespace",
    "ScoredItem",
    "dual_of",
    "langgraph_view",
    "make_store",
    "memory_namespace",
    "open_store",
    "users_of",
]
