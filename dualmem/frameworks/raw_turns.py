"""``raw-turns``: no writer at all — every turn is stored verbatim and searched.

Each turn becomes one ``fact`` row of a :class:`~dualmem.stores.DualStore` in its
own folder ``{uri}/raw-turns`` (so it never mixes with DualMem's memory), keyed
by a stable id of (namespace, session, turn): re-ingesting a session replaces
its rows instead of duplicating them. The row's text — what is embedded and
searched — is ``"Speaker: text"`` (the turn with who said it; questions name
people). ``event_time`` is the session time, ``source`` names the session and
turn, ``meta`` keeps role, speaker and the turn's position.

``retrieve(query, k, context=...)`` ranks with the ``ranker`` setting
(:mod:`dualmem.retrieval`: the learned ranker by default, or a plain ``vector``,
``hybrid`` or ``fts`` store search). Items come back as kind ``"turn"``, ``id`` =
the turn id, ``source_session`` = its session, and ``meta`` with role, speaker, time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.retrieval.pipeline import Ranker
from dualmem.schema import Fact, Session, SourceRef, Turn, stable_id

SUBFOLDER = "raw-turns"


class RawTurnsFramework(MemoryFramework):
    """Store every turn verbatim in LanceDB; retrieve turns with the ranker."""

    name: ClassVar[str] = "raw-turns"
    description: ClassVar[str] = (
        "every turn stored verbatim (with its speaker); turns ranked by the learned ranker or a plain store search"
    )

    def __init__(
        self,
        context: FrameworkContext,
        *,
        ranker: Ranker | str | None = None,
        roles: tuple[str, ...] = ("user", "assistant"),
    ) -> None:
        super().__init__(context)
        self.ranker = (
            ranker
            if isinstance(ranker, Ranker)
            else Ranker.from_settings(context.settings if ranker is None else context.settings.replace(ranker=ranker))
        )
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
                id=turn_item_id(self.namespace, session.id, turn.id),
                namespace=self.namespace,
                text=turn_text(turn),
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
        return IngestReport(
            session_id=session.id, items_written=len(new), meta={"framework": self.name, "already_stored": len(stored)}
        )

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` turns that best match ``query`` (after the conversation ``context``), best first."""
        hits = self.ranker.rank(self.store, self.namespace, query, k, context=context, kinds=("fact",))
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


def turn_item_id(namespace: Sequence[str], session_id: str, turn_id: str) -> str:
    """Return the store id of a turn of ``session_id`` in ``namespace`` (stable: re-ingesting replaces the row)."""
    return stable_id(*namespace, session_id, turn_id, prefix="turn-")


def turn_text(turn: Turn) -> str:
    """Return a turn as raw-turns stores it: ``"Speaker: text"`` (the text alone without a speaker)."""
    return f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text
