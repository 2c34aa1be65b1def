"""The writer's per-chunk core: recall the view, ask the persona, validate, apply — exactly once.

:func:`write_chunk` does one chunk under the namespace's write lease, so one
writer at a time, in any process, works on a namespace, and the view a chunk
is drafted against holds every chunk applied before it. The validated plan is
stored in the ledger as *pending* before any of it is written, and whoever holds
the lease applies every pending plan first (deterministic ids, rows and vectors
in the plan, keyed upserts): a writer killed between drafting and applying
loses nothing, and no chunk is asked or applied twice.

The same steps serve training (:mod:`dualmem.training`): :func:`draft` gives the
prompt and view of a chunk, :func:`decide` validates a model answer into a
plan, :func:`apply_plan` writes it. ``write_chunk`` is those three around the
model call, plus the lease and the ledger.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
from langchain_core.messages import BaseMessage
from typing_extensions import TypedDict

from dualmem.context import Context
from dualmem.errors import LeaseLost
from dualmem.memory.chunking import Chunk
from dualmem.memory.plan import Plan, plan_update
from dualmem.memory.view import View, build_view, empty_view, seqs, view_text
from dualmem.models.structured import Structured, invoke_structured
from dualmem.models.tokens import count_tokens
from dualmem.prompts.writer import render_writer_messages
from dualmem.retrieval import plain
from dualmem.retrieval.snapshot import Snapshot, Snapshots
from dualmem.schema import MemoryItem, MemoryUpdate, Persona, utcnow
from dualmem.stores.contract import DualStore, Namespace

SEQ_KEY = "dualmem.writer:seq"


class ChunkRow(TypedDict, total=False):
    """One line of the run report."""

    chunk_id: str
    index: int
    session_id: str
    turn_ids: list[str]
    status: str  # applied | failed | skipped
    prompt_tokens: int
    attempts: int
    applied: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    merged: list[dict[str, Any]]
    error: str | None
    raw: str | None
    emotion_failed: list[str]
    drafted_by: str
    recovered: bool
    flagged: list[dict[str, Any]]  # the guard's requests among the chunk's turns


def _row(chunk: Chunk, status: str, **extra: Any) -> ChunkRow:
    flagged = [dict(f) for f in chunk.get("flagged") or []]
    row = {
        "chunk_id": chunk["id"],
        "index": chunk["index"],
        "session_id": chunk["session_id"],
        "turn_ids": list(chunk["turn_ids"]),
        "status": status,
        "flagged": flagged,
        **extra,
    }
    return cast(ChunkRow, row)


# --------------------------------------------------------------------------- the view


def _seqs(snap: Snapshot) -> np.ndarray:
    """Return each row's commit order (:func:`~dualmem.memory.view.seqs`), read once per snapshot."""
    found = snap.derived.get(SEQ_KEY)
    if found is None:
        found = snap.derived[SEQ_KEY] = seqs(snap.rows.column("meta"))
    return found


def recall_view(
    store: DualStore,
    namespace: Namespace,
    text: str,
    *,
    k: int = 8,
    recent: int = 4,
    mode: str = "hybrid",
    snapshots: Snapshots | None = None,
) -> View:
    """Return the working view for ``text``: per stream the top-``k`` search hits, then the ``recent`` items written
    last (a pure function of the store's contents and ``text``; see :mod:`dualmem.memory.view`)."""
    snap = (snapshots or Snapshots()).get(store, namespace)
    vector = None if mode == "fts" or k <= 0 else store.embeddings.embed_query(text)
    if not len(snap):
        return empty_view()
    seqs, ids = _seqs(snap), np.asarray(snap.ids, dtype=object)
    chosen: dict[str, list[int]] = {}
    for kind in ("fact", "insight"):
        mask = snap.kinds == kind
        hits = [r for r, _ in plain.search(snap, text, vector, k, mode, mask)] if k > 0 else []
        rows = np.flatnonzero(mask)
        last = rows[np.lexsort((ids[rows], seqs[rows]))[::-1][: max(0, recent)]].tolist() if len(rows) else []
        chosen[kind] = list(dict.fromkeys([*hits, *last]))
    items = {r: item for kind in chosen for r, item in zip(chosen[kind], snap.items(chosen[kind]), strict=True)}
    vectors = {items[r].id: snap.vectors[r].tolist() for r in items}
    return build_view([items[r] for r in chosen["fact"]], [items[r] for r in chosen["insight"]], vectors)


def draft(
    ctx: Context,
    store: DualStore,
    namespace: Namespace,
    persona: Persona,
    chunk: Chunk,
    snapshots: Snapshots | None = None,
) -> tuple[list[BaseMessage], View]:
    """Recall the view for ``chunk`` and return the writer's messages with it."""
    view = recall_view(
        store,
        namespace,
        chunk["text"],
        k=ctx.settings.tuning.view_k,
        recent=ctx.settings.tuning.view_recent,
        mode=ctx.settings.tuning.search_mode,
        snapshots=snapshots,
    )
    return render_writer_messages(persona, view_text(view), chunk["text"]), view


def prompt_tokens(messages: Sequence[BaseMessage]) -> int:
    """Return the token count of a rendered prompt."""
    return count_tokens("\n".join(str(m.content) for m in messages))


# --------------------------------------------------------------------------- the answer


def decide(
    ctx: Context,
    store: DualStore,
    namespace: Namespace,
    chunk: Chunk,
    view: View,
    tokens: int,
    out: Structured[MemoryUpdate],
    seq: int,
    now: Any = None,
) -> tuple[ChunkRow, Plan | None]:
    """Validate the writer's answer into a plan; return its report row (``failed`` without a usable answer)."""
    if not out.ok or out.value is None:
        error = out.error if out.call_failed else f"no valid MemoryUpdate after {out.attempts} attempt(s): {out.error}"
        raw = (out.raw[-1] if out.raw else "")[:2000]
        return _row(chunk, "failed", prompt_tokens=tokens, attempts=out.attempts, error=error, raw=raw), None
    plan = plan_update(
        out.value,
        view,
        chunk,
        namespace,
        embeddings=store.embeddings,
        dedup_threshold=ctx.settings.tuning.dedup_threshold,
        max_ops=ctx.settings.tuning.max_ops_per_chunk,
        now=now or utcnow(),
        seq=seq,
    )
    unscored = score_emotions(ctx, plan) if ctx.settings.tuning.emotion_strategy else []
    row = _row(
        chunk,
        "planned",
        prompt_tokens=tokens,
        attempts=out.attempts,
        applied=plan["applied"],
        rejected=plan["rejected"],
        merged=plan["merged"],
        error=None,
        emotion_failed=unscored,
        drafted_by=uuid.uuid4().hex,
    )
    return row, plan


def score_emotions(ctx: Context, plan: Plan) -> list[str]:
    """Give the plan's active rows an 8-emotion vector (``emotion_strategy`` on); return the ids whose scoring failed."""
    from dualmem.writer.emotion import score_emotion

    failed = []
    for row in plan["upserts"]:
        if row.get("status") != "active":
            continue
        out = score_emotion(
            ctx.llm("writer"), row["text"], retries=ctx.settings.tuning.max_retries, policy=ctx.settings
        )
        if out.value is None:
            failed.append(row["id"])
        else:
            row["emotion"] = out.value.vector()
    return failed


def apply_plan(store: DualStore, plan: Plan) -> None:
    """Write a plan's rows (the last row of an id wins) in one keyed upsert, with the plan's vectors."""
    rows = list({row["id"]: row for row in plan["upserts"]}.values())
    if not rows:
        return
    vectors = plan.get("vectors") or {}
    missing = [r["text"] for r in rows if r["id"] not in vectors]
    fresh = iter(store.embeddings.embed_documents(missing) if missing else [])
    store.upsert([MemoryItem.model_validate(r) for r in rows], [vectors.get(r["id"]) or next(fresh) for r in rows])


def flush_pending(
    store: DualStore, namespace: Namespace, pending: Sequence[tuple[str, str]], lease: Any
) -> dict[str, Any]:
    """Apply the namespace's pending plans (this writer's or a dead one's) and mark them applied; return chunk id ->
    its record.

    Call it while holding the namespace's write lease; ``lease.check()`` fences each commit.
    """
    done = _apply_pending(store, pending, lease)
    lease.check()
    store.ledger.mark_all(namespace, [(c, "applied", _summary(r)) for c, r in done.items()])
    return done


def _summary(record: dict[str, Any]) -> str:
    plan = record["plan"]
    return json.dumps(
        {"applied": plan["applied"], "merged": plan["merged"], "drafted_by": record.get("drafted_by")}, default=str
    )


def _apply_pending(store: DualStore, pending: Sequence[tuple[str, str]], lease: Any) -> dict[str, Any]:
    done: dict[str, Any] = {}
    for chunk_id, payload in pending:
        record = json.loads(payload)
        lease.check()
        apply_plan(store, record["plan"])
        done[chunk_id] = record
    return done


class Writing:
    """One writer's hold on a namespace, across any number of chunks: :func:`writing` makes it.

    Invariants: the namespace's write lease is held for the object's whole life, so the
    ledger it read once at the start stays true (nobody else writes the namespace); a
    chunk costs two commits — the ledger (this chunk's plan *pending*, and the chunks
    applied since the last ledger commit marked *applied*, in one commit), then the plan's
    rows. A chunk whose rows are written but not yet marked applied is *pending* in the
    ledger: a writer that dies there has its plan re-applied by the next one, and
    re-applying a plan is a no-op (deterministic ids and rows, keyed upserts), so every
    chunk is applied exactly once. :meth:`close` marks the last chunks applied.
    """

    def __init__(self, store: DualStore, namespace: Namespace, lease: Any) -> None:
        self.store, self.namespace, self.lease = store, tuple(namespace), lease
        applied, pending = store.ledger.units(namespace)  # one read, under the lease
        self.recovered = _apply_pending(store, pending, lease)  # a dead writer's plans, applied word for word
        self.unmarked = [(c, "applied", _summary(r)) for c, r in self.recovered.items()]
        self.applied = applied | set(self.recovered)
        self.seq = len(self.applied)  # commit order: chunks this namespace applied before the next one

    def write(
        self, ctx: Context, persona: Persona, chunk: Chunk, config: Any = None, snapshots: Snapshots | None = None
    ) -> ChunkRow:
        """Write one chunk exactly once; return its report row (``skipped``, ``applied`` or ``failed``)."""
        if chunk["id"] in self.recovered:
            plan = self.recovered[chunk["id"]]["plan"]
            return _row(
                chunk,
                "applied",
                attempts=0,
                applied=plan["applied"],
                rejected=plan["rejected"],
                merged=plan["merged"],
                recovered=True,
            )
        if chunk["id"] in self.applied:
            return _row(chunk, "skipped", attempts=0)
        messages, view = draft(ctx, self.store, self.namespace, persona, chunk, snapshots)
        out = invoke_structured(
            ctx.llm("writer"),
            messages,
            MemoryUpdate,
            retries=ctx.settings.tuning.max_retries,
            config=config,
            policy=ctx.settings,
        )
        row, plan = decide(ctx, self.store, self.namespace, chunk, view, prompt_tokens(messages), out, self.seq)
        if plan is None:
            return row
        record = {"plan": plan, "drafted_by": row["drafted_by"]}
        self.lease.check()
        self.store.ledger.mark_all(
            self.namespace, [*self.unmarked, (chunk["id"], "pending", json.dumps(record, default=str))]
        )
        self.unmarked = []  # from here on, a crash loses nothing
        self.lease.check()
        apply_plan(self.store, plan)
        self.unmarked.append((chunk["id"], "applied", _summary(record)))
        self.applied.add(chunk["id"])
        self.seq += 1
        row["status"] = "applied"
        return row

    def close(self) -> None:
        """Mark the chunks applied since the last ledger commit (one commit; nothing when the lease was lost)."""
        if self.unmarked:
            try:
                self.lease.check()
            except LeaseLost:  # the next writer re-applies them (a no-op) and marks them
                return
            self.store.ledger.mark_all(self.namespace, self.unmarked)
            self.unmarked = []


@contextmanager
def writing(
    store: DualStore, namespace: Namespace, give_up: Callable[[], bool] | None = None
) -> Iterator[Writing | None]:
    """Hold ``namespace``'s write lease for the block and yield a :class:`Writing` (None when ``give_up`` answered True
    while waiting for another writer)."""
    with store.exclusive(namespace, give_up=give_up) as lease:
        if lease is None:
            yield None
            return
        held = Writing(store, namespace, lease)
        try:
            yield held
        finally:
            held.close()


def write_chunk(
    ctx: Context,
    store: DualStore,
    namespace: Namespace,
    persona: Persona,
    chunk: Chunk,
    config: Any = None,
    snapshots: Snapshots | None = None,
) -> ChunkRow:
    """Write one chunk exactly once, under the namespace's write lease; return its report row.

    ``skipped``: applied before (by any writer); ``applied``: written now (a plan left
    pending by a writer that died is applied, not asked again); ``failed``: no usable answer.
    To write many chunks of one namespace, hold it once with :func:`writing`.
    """
    with writing(store, namespace, give_up=lambda: store.ledger.applied(namespace, chunk["id"])) as held:
        if held is None:  # another writer applied this chunk while we waited for the namespace
            return _row(chunk, "skipped", attempts=0)
        return held.write(ctx, persona, chunk, config, snapshots)
