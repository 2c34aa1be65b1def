"""A rollout's memory during training: the product's writer core on the product's in-memory store.

An :class:`EpisodeMemory` is one writer's memory of one namespace, held in an
:class:`~dualmem.stores.memory.InMemoryDualStore`. A writing turn is
:func:`~dualmem.writer.core.write_chunk` with the model call taken out, so that
a policy (TRL's batched generation, VeRL's rollout server, a gold target) can
answer in between:

1. :meth:`EpisodeMemory.draft` — the product's working view of the chunk and
   the writer's exact prompt for it (:func:`~dualmem.writer.core.draft`);
2. the policy answers;
3. :meth:`EpisodeMemory.write` — the answer parsed into a ``MemoryUpdate``,
   validated by :func:`~dualmem.writer.core.decide` (``plan_update``: grounding,
   dedup merge, the poisoning guard, the op cap) and committed as
   ``write_chunk`` commits: pending in the ledger, then
   :func:`~dualmem.writer.core.flush_pending` (applied, marked applied).

Invariants:

- for the same answers, the memory equals what
  :func:`~dualmem.writer.history.write_history` stores with the same settings:
  the view, the plan rules and ``seq`` (the chunks the namespace applied
  before) are the product's; an answer without a ``MemoryUpdate`` writes
  nothing and leaves the chunk unapplied, like a failed chunk (there is no
  repair round: the policy's one sampled answer is what is scored);
- a rollout owns its store: nothing else writes it;
- a :class:`Seed` (every row of any status with its stored vector, and the
  applied chunk ids) rebuilds a memory that the writer cannot tell from the
  one it was taken from: same rows, vectors and ``seq``; only write times are
  the copy's own;
- a turn's counts come from the plan's records: ``invalid`` = rejected
  operations, ``dangling`` = the rejected insights among them that cite an id
  which is neither a view fact nor a fact the update adds, ``unparseable`` =
  objects that are not a ``MemoryUpdate`` when none is.

Emotion scoring is off in training contexts (:func:`writer_context`): it calls
another model and changes no text, id or view.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings
from pydantic import ValidationError

from dualmem.config import Settings
from dualmem.context import Context, context_of
from dualmem.memory.chunking import Chunk
from dualmem.memory.plan import Plan
from dualmem.memory.view import View, seqs
from dualmem.models.structured import Structured
from dualmem.retrieval.snapshot import Snapshots
from dualmem.schema import MemoryItem, MemoryUpdate, Persona
from dualmem.stores.memory import InMemoryDualStore
from dualmem.writer.core import ChunkRow, decide, draft, flush_pending

ROLE = {"system": "system", "human": "user", "user": "user", "ai": "assistant", "assistant": "assistant"}
DANGLING = "which is neither a working-memory fact nor a fact added"  # plan_update's reason for an unknown citation


def to_dicts(messages: Sequence[Any]) -> list[dict[str, str]]:
    """Return LangChain messages (or dicts) as ``[{"role", "content"}]`` with OpenAI role names."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else (m.type, m.content)
        out.append({"role": ROLE.get(str(role), str(role)), "content": str(content)})
    return out


def writer_context(
    settings: Context | Settings | dict[str, Any] | None = None,
    *,
    embedder: str | Embeddings | None = None,
    **changes: Any,
) -> Context:
    """Return the writer's context for training: ``settings`` (a context, settings, or default: the environment's) with
    ``changes`` (``view_k``, ``view_recent``…), the store's embedder ``embedder`` (empty: the context's, else the
    ``embedder`` setting's), no emotion scoring."""
    ctx = context_of(settings, **changes)
    if embedder:
        from dualmem.models import load_embeddings

        ctx = ctx.with_(embeddings=load_embeddings(embedder))
    return ctx.with_(emotion_strategy="") if ctx.settings.tuning.emotion_strategy else ctx


def parse_updates(text: str) -> tuple[list[MemoryUpdate], int]:
    """Return every ``MemoryUpdate`` JSON object in ``text`` and the count of unparseable ones (>= 1 if none)."""
    decoder = json.JSONDecoder()
    updates, bad, i = [], 0, 0
    while (start := text.find("{", i)) >= 0:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        i = end
        try:
            updates.append(MemoryUpdate.model_validate(obj))
        except ValidationError:
            bad += 1
    return updates, (bad if updates else max(bad, 1))


def parse_update(text: str) -> MemoryUpdate | None:
    """Return the first valid ``MemoryUpdate`` in ``text``, or None."""
    updates, _ = parse_updates(text)
    return updates[0] if updates else None


@dataclass(frozen=True)
class Seed:
    """A memory to start from: every row (any status) with its stored vector, and the chunks applied before it."""

    items: tuple[MemoryItem, ...] = ()
    vectors: tuple[tuple[float, ...], ...] = ()
    applied: tuple[str, ...] = ()

    def active(self) -> list[MemoryItem]:
        """Return the active items."""
        return [i for i in self.items if i.status == "active"]

    def to_json(self) -> dict[str, Any]:
        """Return the seed as plain JSON."""
        return {
            "items": [i.model_dump(mode="json") for i in self.items],
            "vectors": [list(v) for v in self.vectors],
            "applied": list(self.applied),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Seed:
        """Read a seed written by :meth:`to_json`."""
        data = data or {}
        return cls(
            tuple(MemoryItem.model_validate(i) for i in data.get("items", [])),
            tuple(tuple(v) for v in data.get("vectors", [])),
            tuple(data.get("applied", [])),
        )


@dataclass
class TurnResult:
    """One writing turn: its report row (``applied`` or ``failed``), the plan, and the counts the reward uses."""

    row: ChunkRow
    plan: Plan | None
    unparseable: int = 0
    invalid: int = 0
    dangling: int = 0


def bare_chunk(chunk_id: str, index: int = 0, text: str = "") -> Chunk:
    """Return a chunk without turns (an answer replayed without its history)."""
    return Chunk(id=chunk_id, index=index, session_id="", time=None, turn_ids=[], user_turn_ids=[], text=text, tokens=0)


class EpisodeMemory:
    """One namespace's memory in its own in-memory store, written turn by turn through the writer's core."""

    def __init__(self, ctx: Context, namespace: Sequence[str], persona: Persona, seed: Seed | None = None) -> None:
        from dualmem.models import embedding_dims

        embeddings = ctx.load_embedder()
        self.ctx, self.namespace, self.persona = ctx, tuple(namespace), persona
        self.store = InMemoryDualStore(embeddings, dims=embedding_dims(embeddings))
        self.snapshots = Snapshots()  # the reader's RAM view of the store, as write_history holds one
        seed = seed or Seed()
        if seed.items:
            self.store.upsert(list(seed.items), [list(v) for v in seed.vectors])
        for unit in seed.applied:
            self.store.ledger.mark(self.namespace, unit, "applied")

    def draft(self, chunk: Chunk) -> tuple[list[dict[str, str]], View]:
        """Return the writer's exact prompt for ``chunk`` (role/content dicts) and the working view it shows."""
        messages, view = draft(self.ctx, self.store, self.namespace, self.persona, chunk, self.snapshots)
        return to_dicts(messages), view

    def decide(
        self, chunk: Chunk, view: View, update: MemoryUpdate | None, error: str = "", raw: str = ""
    ) -> tuple[ChunkRow, Plan | None]:
        """Validate ``update`` (None: no usable answer) against ``view`` into a plan, without writing it."""
        out: Structured[MemoryUpdate] = Structured(
            value=update, error=None if update is not None else error or "no MemoryUpdate", attempts=1, raw=[raw]
        )
        return decide(self.ctx, self.store, self.namespace, chunk, view, 0, out, self.applied())

    def commit(self, chunk: Chunk, row: ChunkRow, plan: Plan) -> None:
        """Apply ``plan`` as ``write_chunk`` does: pending in the ledger, then applied and marked applied."""
        payload = json.dumps({"plan": plan, "drafted_by": row["drafted_by"]}, default=str)
        with self.store.exclusive(self.namespace) as lease:
            self.store.ledger.mark(self.namespace, chunk["id"], "pending", payload)
            flush_pending(self.store, self.namespace, [(chunk["id"], payload)], lease)
        row["status"] = "applied"

    def write(self, chunk: Chunk, view: View, answer: str | MemoryUpdate) -> TurnResult:
        """Write the policy's answer for ``chunk`` (its text, or a parsed update) against the view it was shown."""
        update: MemoryUpdate | None
        if isinstance(answer, MemoryUpdate):
            update, bad, raw = answer, 0, ""
        else:
            updates, bad = parse_updates(answer)
            update, raw = (updates[0] if updates else None), answer
        row, plan = self.decide(chunk, view, update, error="the answer holds no MemoryUpdate JSON object", raw=raw)
        if plan is None:
            return TurnResult(row, None, unparseable=bad)
        self.commit(chunk, row, plan)
        return TurnResult(
            row, plan, invalid=len(plan["rejected"]), dangling=sum(is_dangling(r) for r in plan["rejected"])
        )

    def applied(self) -> int:
        """Return how many chunks this memory applied (the next chunk's ``seq``)."""
        return len(self.store.ledger.applied_ids(self.namespace))

    def items(self, status: str | None = "active") -> list[MemoryItem]:
        """Return the items of ``status`` (None: every row) in commit order (``seq``, then id)."""
        rows = self.store.scan(self.namespace, status=status)
        ids = np.asarray(rows.column("id").to_pylist(), dtype=object)
        return self.store.get(self.namespace, ids[np.lexsort((ids, seqs(rows.column("meta"))))].tolist())

    def seed(self) -> Seed:
        """Return a seed that rebuilds this memory (see the module invariants)."""
        table = self.store.scan(self.namespace, status=None, columns="vectors")
        ids = table.column("id").to_pylist()
        vectors = tuple(tuple(float(x) for x in v) for v in table.column("vector").to_pylist())
        return Seed(
            tuple(self.store.get(self.namespace, ids)),
            vectors,
            tuple(sorted(self.store.ledger.applied_ids(self.namespace))),
        )


def is_dangling(record: dict[str, Any]) -> bool:
    """Return True for a rejected insight that cites an id the update could not resolve."""
    return record.get("stream") == "insight" and DANGLING in str(record.get("reason", ""))
