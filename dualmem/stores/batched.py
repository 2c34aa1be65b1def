"""Concurrent async store calls of one event loop as one batch: LangGraph's own ``AsyncBatchedBaseStore`` over a
DualMem LangGraph store (the LangGraph server's path: :func:`~dualmem.stores.langgraph_store.make_store` returns one
when the server builds its store inside its event loop).

Every ``aget``/``aput``/``asearch``/… issued in one tick of the loop is queued and handed to the wrapped store's
``abatch`` together — LangGraph de-duplicates puts of one key (the last wins), and DualMem's ``abatch`` writes all
puts in one commit — so 500 gathered puts cost one commit instead of 500. Sync calls from worker threads go through
the same queue; sync calls on the event loop's own thread are refused by LangGraph (they would block it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langgraph.store.base import Op, Result
from langgraph.store.base.batch import AsyncBatchedBaseStore


class BatchedStore(AsyncBatchedBaseStore):
    """A LangGraph ``BaseStore`` that batches a loop's concurrent calls into the wrapped store's ``abatch``."""

    def __init__(self, store: Any) -> None:
        super().__init__()  # needs the running event loop
        self.store = store

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run one batch of operations on the wrapped store."""
        return await self.store.abatch(ops)

    @property
    def supports_ttl(self) -> bool:  # type: ignore[override]
        """Whether puts may carry a ``ttl`` (the wrapped store's answer)."""
        return bool(getattr(self.store, "supports_ttl", False))

    @property
    def ttl_config(self) -> Any:  # type: ignore[override]
        """The wrapped store's TTL configuration."""
        return getattr(self.store, "ttl_config", None)

    @property
    def index_config(self) -> Any:
        """The wrapped store's index configuration."""
        return getattr(self.store, "index_config", None)

    def __getattr__(self, name: str) -> Any:  # the wrapped store's own API (dual, memory_label, uri, sweeper…)
        if name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)

    def __repr__(self) -> str:
        return f"BatchedStore({self.store!r})"
