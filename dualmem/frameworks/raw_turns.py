"""``raw-turns``: no writer at all — every turn is stored verbatim and searched.

Each turn becomes one ``fact`` row of a :class:`~dualmem.stores.DualStore` in its
own folder ``{uri}/raw-turns`` (so it never mixes with DualMem's memory), keyed
by a stable id of (namespace, session, turn): re-ingesting a session replaces
its rows instead of duplicating them. ``event_time`` is the session time and
``source`` names the session and turn.

``retrieve(query, k)`` searches with ``mode`` (``vector`` = dense only,
``hybrid`` = dense + full text fused by RRF, ``fts``); by default the
``search_mode`` setting. Items come back as kind ``"turn"``, ``id`` = the turn id,
``source_session`` = its session, and ``meta`` with role, speaker, time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.schema import Fact, Session, SourceRef, stable_id
from dualmem.stores.dual import SearchMode

SUBFOLDER = "raw-turns"


class RawTurnsFramework(MemoryFramework):
    """Store every turn verbatim in LanceDB; retrieve turns by dense or hybrid search."""

    name: ClassVar[str] = "raw-turns"
    description: ClassVar[str] = "every turn stored verbatim; dense or hybrid (vector + full-text) turn retrieval"

    def __init__(
        self,
        context: FrameworkContext,
        *,
        mode: SearchMode | None = None,
        roles: tuple[str, ...] = ("user", "assistant"),
    ) -> None:
        super().__init__(context)
        self.mode: SearchMode = mode or context.settings.search_mode  # type: ignore[assignment]
        if self.mode not in ("hybrid", "vector", "fts"):
            raise ConfigurationError(f"raw-turns search mode {self.mode!r} is not one of hybrid, vector, fts")
        self.roles = roles
        self.store = context.open_store(SUBFOLDER)

    @property
    def namespace(self) -> tuple[str, ...]:
        """Return the memory namespace served."""
        return tuple(self.context.namespace)

    def ingest(self, session: Session) -> IngestReport:
        """Store each turn of ``session`` verbatim (idempotent per session and turn)."""
        items = [
            Fact(
                id=stable_id(*self.namespace, session.id, turn.id, prefix="turn-"),
                namespace=self.namespace,
                text=turn.text,
                source=SourceRef(session_id=session.id, turn_ids=[turn.id]),
                event_time=session.time,
                meta={"role": turn.role, "speaker": turn.speaker, "turn_index": index, "turn_id": turn.id},
            )
            for index, turn in enumerate(session.turns)
            if turn.role in self.roles and turn.text.strip()
        ]
        stored = {i.id for i in self.store.get(self.namespace, [i.id for i in items])} if items else set()
        new = [i for i in items if i.id not in stored]  # a session ingested before (any process) is not embedded again
        if new:
            self.store.upsert(new)
        return IngestReport(session_id=session.id, items_written=len(new), meta={"framework": self.name, "already_stored": len(stored)})

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` turns that best match ``query``, best first."""
        hits = self.store.search(self.namespace, query, kind="fact", k=k, mode=self.mode)
        out = []
        for hit in hits:
            item = hit.item
            out.append(
                RetrievedItem(
                    text=item.text,
                    kind="turn",
                    score=float(hit.score),
                    source_session=item.source.session_id,
                    id=item.meta.get("turn_id") or (item.source.turn_ids[0] if item.source.turn_ids else item.id),
                    meta={
                        "role": item.meta.get("role"),
                        "speaker": item.meta.get("speaker"),
                        "time": item.event_time,
                        "store_id": item.id,
                    },
                )
            )
        return out

    def count(self) -> int:
        """Return how many turns are stored for this namespace."""
        return self.store.count(self.namespace, kind="fact")

    def reset(self) -> None:
        """Forget every stored turn of this namespace."""
        self.store.drop_namespace(self.namespace)
