"""Labelled queries for fitting the ranker, built from RealMem and LoCoMo as ``dualmem eval`` asks them.

Each dataset item (a RealMem persona, a LoCoMo conversation) is ingested once
into a ``raw-turns`` store — every turn as ``"Speaker: text"``, the rows the
product ranks — and each of its queries becomes an :class:`~dualmem.retrieval.fit.Example`
in the group named by the item's id, so fitting can leave whole personas or
conversations out:

- **RealMem** (replay): a query sees only the sessions before its own
  (``filter`` on ``session_id``), its context is the turns of its own session
  said before it (:func:`dualmem.evals.runners.query_context`, what the eval
  runner passes), and every turn of a gold session is relevant (the metric ranks
  sessions);
- **LoCoMo**: every session is visible, questions come without context, the
  gold evidence turns are relevant; categories 1-4 only (5 is adversarial and
  not scored).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dualmem.evals.runners import LOCOMO_SCORED, query_context
from dualmem.frameworks.base import FrameworkContext
from dualmem.frameworks.raw_turns import RawTurnsFramework, turn_item_id
from dualmem.retrieval.fit import Example
from dualmem.schema import DatasetItem
from dualmem.stores.contract import DualStore, Namespace

USER = "user"


def ingest_turns(item: DatasetItem, context: FrameworkContext) -> RawTurnsFramework:
    """Return a ``raw-turns`` framework of ``context`` holding every session of ``item`` (ingested in order)."""
    framework = RawTurnsFramework(context, ranker="vector")
    for session in item.dialogue.sessions:
        framework.ingest(session)
    return framework


def realmem_examples(item: DatasetItem, namespace: Namespace) -> list[Example]:
    """Return the RealMem queries of ``item`` as replayed examples (earlier sessions only, own-session context)."""
    order = [s.id for s in item.dialogue.sessions]
    position = {sid: i for i, sid in enumerate(order)}
    out = []
    for q in item.queries:
        if not q.gold.session_ids or q.session_id not in position:
            continue
        earlier = order[: position[q.session_id]]
        if not earlier:
            continue
        out.append(
            Example(
                namespace=namespace,
                query=q.text,
                relevant_sessions=tuple(q.gold.session_ids),
                context=query_context(q, item),
                filter={"session_id": {"$in": earlier}},
                group=item.dialogue.id,
                id=q.id,
            )
        )
    return out


def locomo_examples(item: DatasetItem, namespace: Namespace) -> list[Example]:
    """Return the LoCoMo questions of ``item`` (categories 1-4) with their evidence turns' store ids."""
    session_of = {t.id: s.id for s in item.dialogue.sessions for t in s.turns}
    out = []
    for q in item.queries:
        if str(q.category) not in LOCOMO_SCORED:
            continue
        ids = tuple(turn_item_id(namespace, session_of[t], t) for t in q.gold.turn_ids if t in session_of)
        if ids:
            out.append(
                Example(
                    namespace=namespace,
                    query=q.text,
                    relevant_ids=ids,
                    group=item.dialogue.id,
                    id=q.id,
                    meta={"category": str(q.category), "n_gold": len(q.gold.turn_ids)},
                )
            )
    return out


def examples_of(kind: str, item: DatasetItem, namespace: Namespace) -> list[Example]:
    """Return the examples of one item of a ``realmem`` or ``locomo`` dataset."""
    if kind == "realmem":
        return realmem_examples(item, namespace)
    if kind == "locomo":
        return locomo_examples(item, namespace)
    raise ValueError(f"no ranker examples for dataset {kind!r}; use realmem or locomo")


def store_examples(
    kind: str, items: Iterable[DatasetItem], context_of_item: Any
) -> list[tuple[DualStore, list[Example]]]:
    """Ingest each item with ``context_of_item(item) -> FrameworkContext`` and return (store, examples) per item."""
    out = []
    for item in items:
        context = context_of_item(item)
        framework = ingest_turns(item, context)
        out.append((framework.store, examples_of(kind, item, framework.namespace)))
    return out
