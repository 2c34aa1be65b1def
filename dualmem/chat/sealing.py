"""The write graph's pending mode: a chat thread's pending turns sealed into chunks, then settled.

- :func:`take_pending` reads the thread's turns under the namespace's write
  lease and *seals* the next chunks: the token-bounded
  chunks that are full, and the last one too when the thread is quiet (or on
  ``flush``). Each turn records its chunk id before the writer runs, so a chunk
  is always made of the same turns (its stable id hashes namespace, thread and
  turn ids) however many turns arrive later;
- the writer drafts and applies each chunk exactly once (chunk ledger);
- :func:`settle_pending` deletes the turns of applied chunks and reports what is left;
- :func:`form_pending` is the three in a row (what the ``write`` graph's pending mode runs, and chat
  formation in this process).

How the turns get there and who runs the writes: :mod:`dualmem.chat.formation`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from dualmem.chat.pending import PendingThread, PendingTurn, Snapshot, graph_store, seal_ops, settle_ops
from dualmem.context import Context
from dualmem.errors import ConfigurationError
from dualmem.memory.chunking import Chunk, chunk_sessions
from dualmem.schema import Persona, Session, Turn
from dualmem.stores.contract import Lease

IDLE_SLACK_S = 1.0  # a write scheduled for the quiet time may start this early (clocks, whole-second server delays)


def is_quiet(snap: Snapshot, idle_s: float, now: float | None = None) -> bool:
    """Return True when the thread's newest pending turn is at least ``idle_s`` old."""
    newest = snap.newest_at
    return newest is not None and (now or time.time()) >= newest + idle_s - min(IDLE_SLACK_S, idle_s / 10)


def _session(thread: str, turns: Sequence[PendingTurn]) -> tuple[Session, list[Turn]]:
    """Return turns as one session of the thread (dated by its first turn) and the guard's earlier context."""
    day = datetime.fromtimestamp(turns[0]["at"], UTC).date().isoformat()
    session = Session(
        id=thread,
        time=day,
        turns=[Turn(id=t["id"], role=t["role"], speaker=t["speaker"], text=t["text"]) for t in turns],  # type: ignore[arg-type]
    )
    context = [Turn(id=f"earlier-{i}", role="user", text=text) for i, text in enumerate(turns[0]["earlier"])]
    return session, context


def plan_chunks(
    snap: Snapshot, namespace: Sequence[str], thread: str, chunk_tokens: int, *, write_tail: bool
) -> tuple[list[Chunk], dict[str, str]]:
    """Return the chunks to write now (sealed ones first, in order) and the new seals (turn id → chunk id).

    Unsealed turns are cut like any history (:func:`~dualmem.memory.chunking.chunk_sessions`);
    every chunk but the last is full; the last is written when ``write_tail`` or when it is full.
    """
    chunks: list[Chunk] = []
    groups: dict[str, list[PendingTurn]] = {}
    for turn in snap.turns:
        if turn["seal"]:
            groups.setdefault(turn["seal"], []).append(turn)
    for seal, group in groups.items():
        session, context = _session(thread, group)
        (chunk,) = chunk_sessions([session], namespace, 10**9, context=context)  # a sealed group is one chunk
        chunks.append(Chunk(**{**chunk, "id": seal}))  # type: ignore[typeddict-item]
    seals: dict[str, str] = {}
    unsealed = [t for t in snap.turns if not t["seal"]]
    if unsealed:
        session, context = _session(thread, unsealed)
        cut = chunk_sessions([session], namespace, chunk_tokens, context=context)
        take = cut if write_tail or cut[-1]["tokens"] >= chunk_tokens else cut[:-1]
        for chunk in take:
            seals.update({tid: chunk["id"] for tid in chunk["turn_ids"]})
        chunks.extend(take)
    return [Chunk(**{**c, "index": i}) for i, c in enumerate(chunks)], seals  # type: ignore[typeddict-item]


def take_pending(
    ctx: Context,
    thread: PendingThread,
    *,
    flush: bool = False,
    persona: dict[str, Any] | None = None,
    lease: Lease,
) -> tuple[list[Chunk], dict[str, Any] | None]:
    """Seal the thread's next chunks under the namespace's write lease, which the caller holds; return them and the
    thread's persona."""
    snap = thread.read()
    quiet = flush or is_quiet(snap, ctx.settings.tuning.formation_idle_s)
    chunks, seals = plan_chunks(
        snap, thread.namespace, thread.thread, ctx.settings.tuning.chunk_tokens, write_tail=quiet
    )
    if seals:
        lease.check()
        thread.write(seal_ops(thread.ns, snap, seals))
    persona = persona or snap.persona
    if chunks and not persona:
        raise ConfigurationError(
            f"thread {thread.thread!r} has pending turns but no persona: pass `persona` in the write graph's input"
        )
    return chunks, persona


def settle_pending(
    thread: PendingThread, chunks: list[Chunk], rows: list[dict[str, Any]], *, lease: Lease
) -> dict[str, Any]:
    """Delete the pending turns whose chunks are applied, under the namespace's write lease, which the caller holds;
    return what the thread still has pending."""
    applied = {r["chunk_id"] for r in rows if r.get("status") in ("applied", "skipped")}
    done = [tid for chunk in chunks if chunk["id"] in applied for tid in chunk["turn_ids"]]
    snap = thread.read()
    ops = settle_ops(thread.ns, snap, done)
    if ops:
        lease.check()
        thread.write(ops)
    left = [t for t in snap.turns if t["id"] not in set(done)]
    return {
        "thread": thread.thread,
        "written_turns": len(done),
        "pending_turns": len(left),
        "pending_tokens": sum(t["tokens"] for t in left),
        "newest_at": max((t["at"] for t in left), default=None),
    }


def form_pending(
    ctx: Context,
    store: Any,
    namespace: tuple[str, ...],
    thread_id: str,
    *,
    flush: bool = False,
    persona: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Seal the thread's pending turns into chunks, write each exactly once, settle them — all under one hold of the
    namespace's write lease; return the report rows and what is still pending."""
    from dualmem.writer.core import Writing, writing

    db = ctx.dual(store)
    thread = PendingThread(graph_store(store if store is not None else db), namespace, thread_id)
    with writing(db, namespace) as hold:
        held = cast(Writing, hold)  # no give_up: it waits for the namespace, never None
        chunks, who = take_pending(ctx, thread, flush=flush, persona=persona, lease=held.lease)
        rows = [dict(held.write(ctx, Persona.model_validate(who), chunk)) for chunk in chunks]
        left = settle_pending(thread, chunks, rows, lease=held.lease)
    return rows, left
