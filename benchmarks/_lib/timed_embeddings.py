"""Embeddings that record when they ran: how much of a writer's time between model calls is the embedder's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings


class TimedEmbeddings(Embeddings):
    """Forward to ``inner``, recording each call's ``(start, end)`` (``time.perf_counter`` seconds)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dims = getattr(inner, "dims", None)
        self.asymmetric = getattr(inner, "asymmetric", False)
        self.spans: list[tuple[float, float]] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        start = time.perf_counter()
        try:
            return self.inner.embed_documents(texts)
        finally:
            self.spans.append((start, time.perf_counter()))

    def embed_query(self, text: str) -> list[float]:
        start = time.perf_counter()
        try:
            return self.inner.embed_query(text)
        finally:
            self.spans.append((start, time.perf_counter()))

    def within(self, gaps: Sequence[tuple[float, float]]) -> list[float]:
        """Return the embedder's milliseconds inside each ``(start, end)`` gap."""
        return [sum(max(0.0, min(e, b) - max(s, a)) for s, e in self.spans) * 1000 for a, b in gaps]
