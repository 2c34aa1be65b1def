"""A memory framework with a known ranking, for testing runners and the evaluate graph offline.

:class:`TurnLogFramework` stores raw turns and ranks them either newest first
(``ranking="recent"``) or by word overlap with the query, newest first on ties
(``ranking="lexical"``). It logs which sessions were ingested when each
query was asked, so tests can check replay order.

>>> from dualmem.schema import Session, Turn
>>> fw = TurnLogFramework.standalone()
>>> _ = fw.ingest(Session(id="s1", turns=[Turn(id="t1", role="user", text="I work nights")]))
>>> [it.id for it in fw.retrieve("nights?", 5)]
['t1']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.schema import Session


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class TurnLogFramework(MemoryFramework):
    """Raw-turn memory with a deterministic ranking and a log of ingests and queries."""

    name: ClassVar[str] = "turn-log"
    description: ClassVar[str] = "test framework: raw turns, recency or word-overlap ranking"

    def __init__(self, context: FrameworkContext, ranking: str = "recent") -> None:
        super().__init__(context)
        if ranking not in ("recent", "lexical"):
            raise ValueError(f"ranking must be recent or lexical, got {ranking!r}")
        self.ranking = ranking
        self.turns: list[dict[str, Any]] = []
        self.ingested: list[str] = []
        self.queries: list[tuple[str, list[str]]] = []
        self.contexts: list[tuple[str, list[Any]]] = []  # (query, the context turns it was ranked with), per retrieve

    @classmethod
    def standalone(cls, ranking: str = "recent", namespace: tuple[str, str] = ("persona", "user")) -> TurnLogFramework:
        """Return an instance with a default context (no models needed)."""
        return cls(FrameworkContext(namespace=namespace), ranking=ranking)

    def ingest(self, session: Session) -> IngestReport:
        """Store every turn of ``session``."""
        self.ingested.append(session.id)
        for t in session.turns:
            self.turns.append({"id": t.id, "text": t.text, "session": session.id, "order": len(self.turns)})
        return IngestReport(session_id=session.id, items_written=len(session.turns))

    def _score(self, query: str, turn: dict[str, Any]) -> float:
        return float(len(_words(query) & _words(turn["text"]))) if self.ranking == "lexical" else 0.0

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` best turns (see the class docstring for the ranking)."""
        self.queries.append((query, list(self.ingested)))
        self.contexts.append((query, list(context or [])))
        ranked = sorted(self.turns, key=lambda t: (-self._score(query, t), -t["order"]))[:k]
        return [
            RetrievedItem(
                text=t["text"],
                kind="fact",
                score=self._score(query, t),
                source_session=t["session"],
                id=t["id"],
                meta={"turn_ids": [t["id"]]},
            )
            for t in ranked
        ]

    def respond(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> str:
        """Answer with the best turn's text (no model call)."""
        items = self.retrieve(query, k, context=context)
        return f"From memory: {items[0].text}" if items else "I don't remember."

    def reset(self) -> None:
        """Forget everything."""
        self.turns.clear()
        self.ingested.clear()
