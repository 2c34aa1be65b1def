"""Memory formation from chat: pending turns → sealed chunks → the write graph → settled.

A chat turn is *handed over* (:func:`hand_over`): its turns join the thread's
pending turns in the store (:mod:`dualmem.chat.pending`) and a write of the
thread is scheduled — at once when the pending turns reach ``chunk_tokens``,
else once the thread has been quiet for ``formation_idle_s`` (each new message
postpones it). Where the write runs is a :class:`Formation`: the background
executor of this process (:mod:`dualmem.chat.executor`) or scheduled runs of
the ``write`` graph on a LangGraph server (:mod:`dualmem.chat.server`). Both
run the same graph, in its pending mode (input ``pending: {"thread", "flush"}``):

- :func:`take_pending` (the graph's ``prepare``) reads the thread's turns under
  the namespace's write lease and *seals* the next chunks: the token-bounded
  chunks that are full, and the last one too when the thread is quiet (or on
  ``flush``). Each turn records its chunk id before the writer runs, so a chunk
  is always made of the same turns (its stable id hashes namespace, thread and
  turn ids) however many turns arrive later;
- the writer drafts and applies each chunk exactly once (chunk ledger);
- :func:`settle_pending` deletes the turns of applied chunks and reports what is left.

A process killed anywhere in between loses nothing (the turns stay pending) and
writes nothing twice (a sealed chunk already applied is skipped by the ledger).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from langgraph.store.base import BaseStore

from dualmem.chat.pending import PendingThread, PendingTurn, Snapshot, seal_ops, settle_ops
from dualmem.config import Settings
from dualmem.context import context_of
from dualmem.errors import ConfigurationError
from dualmem.nodes.chunking import Chunk, chunk_sessions
from dualmem.schema import Persona, Session, Turn

IDLE_SLACK_S = 1.0  # a write scheduled for the quiet time may start this early (clocks, whole-second server delays)


@dataclass
class FormationRequest:
    """Which thread to write, through which persona, into which namespace; in-process: with which store and writer."""

    persona: dict[str, Any]
    namespace: tuple[str, ...]
    thread: str
    settings: Settings
    store: BaseStore | None = None  # the LangGraph store (a LanceDBStore) holding the pending turns and the memory
    writer_model: Any = None  # a chat model object or spec; None = settings.writer

    @property
    def key(self) -> tuple[str, tuple[str, ...], str]:
        """Return what identifies the thread across requests: store, namespace, thread."""
        return (str(getattr(self.store, "uri", id(self.store))), self.namespace, self.thread)


class Formation(Protocol):
    """Where chat memory is formed: schedules writes of a thread's pending turns."""

    def schedule(self, request: FormationRequest, *, now: bool) -> None:
        """Write the thread's full chunks now (``now``) and the rest once it is quiet (postponing an earlier plan)."""

    async def aschedule(self, request: FormationRequest, *, now: bool) -> None:
        """Async :meth:`schedule`."""


@dataclass
class Formed:
    """What one formation run of a thread did, and what is still pending."""

    namespace: tuple[str, ...]
    thread: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # the writer's report rows, one per chunk
    pending_turns: int = 0
    pending_tokens: int = 0
    newest_at: float | None = None
    error: str | None = None


# --------------------------------------------------------------------------- hand-over


def hand_over(request: FormationRequest, turns: Sequence[PendingTurn], formation: Formation) -> Snapshot:
    """Add a chat exchange to its thread's pending turns and schedule the thread's write."""
    snap = PendingThread(_store(request), request.namespace, request.thread).append(turns, request.persona)
    formation.schedule(request, now=snap.unsealed_tokens >= request.settings.chunk_tokens)
    return snap


async def ahand_over(request: FormationRequest, turns: Sequence[PendingTurn], formation: Formation) -> Snapshot:
    """Async :func:`hand_over`."""
    snap = await PendingThread(_store(request), request.namespace, request.thread).aappend(turns, request.persona)
    await formation.aschedule(request, now=snap.unsealed_tokens >= request.settings.chunk_tokens)
    return snap


def _store(request: FormationRequest) -> BaseStore:
    if request.store is None:
        raise ConfigurationError("chat memory needs the store: compile the agent or graph with store=LanceDBStore.from_settings()")
    return request.store


def formation_for(settings: Settings, runtime: Any = None) -> Formation:
    """Return the formation ``settings.formation`` asks for (auto: the LangGraph server the run is on, else this process)."""
    from dualmem.chat.executor import default_executor
    from dualmem.chat.server import server_formation

    on_server = getattr(runtime, "server_info", None) is not None
    if settings.formation == "server" or (settings.formation == "auto" and (on_server or settings.formation_url)):
        if not on_server and not settings.formation_url:
            raise ConfigurationError(
                "formation=server outside a LangGraph server needs the server's address: set formation_url "
                "(DUALMEM_FORMATION_URL), or use formation=local"
            )
        return server_formation(settings.formation_url or None)
    return default_executor()


# --------------------------------------------------------------------------- the write graph's pending mode


def graph_store(store: Any) -> BaseStore:
    """Return the LangGraph store view of a graph's store (a ``LanceDBStore``, or one over a ``DualStore``)."""
    from dualmem.stores.dual import DualStore
    from dualmem.stores.langgraph_store import LanceDBStore

    if isinstance(store, DualStore):
        return LanceDBStore(store.uri, dual=store)
    if isinstance(store, BaseStore):
        return store
    raise ConfigurationError("chat memory formation needs the graph's store: compile with store=LanceDBStore.from_settings()")


def is_quiet(snap: Snapshot, idle_s: float, now: float | None = None) -> bool:
    """Return True when the thread's newest pending turn is at least ``idle_s`` old."""
    newest = snap.newest_at
    return newest is not None and (now or time.time()) >= newest + idle_s - min(IDLE_SLACK_S, idle_s / 10)


def _session(thread: str, turns: Sequence[PendingTurn]) -> tuple[Session, list[Turn]]:
    """Return turns as one session of the thread (dated by its first turn) and the guard's earlier context."""
    day = datetime.fromtimestamp(turns[0]["at"], UTC).date().isoformat()
    session = Session(id=thread, time=day, turns=[Turn(id=t["id"], role=t["role"], speaker=t["speaker"], text=t["text"]) for t in turns])  # type: ignore[arg-type]
    context = [Turn(id=f"earlier-{i}", role="user", text=text) for i, text in enumerate(turns[0]["earlier"])]
    return session, context


def plan_chunks(snap: Snapshot, namespace: Sequence[str], thread: str, chunk_tokens: int, *, write_tail: bool) -> tuple[list[Chunk], dict[str, str]]:
    """Return the chunks to write now (sealed ones first, in order) and the new seals (turn id → chunk id).

    Unsealed turns are cut like any history (:func:`~dualmem.nodes.chunking.chunk_sessions`);
    every chunk but the last is full; the last is written when ``write_tail`` or when it is full.
    """
    chunks: list[Chunk] = []
    groups: dict[str, list[PendingTurn]] = {}
    for turn in snap.turns:
        if turn["seal"]:
            groups.setdefault(turn["seal"], []).append(turn)
    for seal, group in groups.items():
        session, context = _session(thread, group)
        (chunk,) = chunk_sessions([session], namespace, 10**9, context=context)  # a sealed group is one chunk, as sealed
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


def take_pending(state: dict[str, Any], runtime: Any, namespace: tuple[str, ...]) -> dict[str, Any]:
    """Seal the thread's next chunks under the namespace's write lease; return them (and the thread's persona)."""
    ctx = context_of(runtime)
    job = state["pending"]
    db = ctx.dual(getattr(runtime, "store", None))
    thread = PendingThread(graph_store(getattr(runtime, "store", None) or db), namespace, job["thread"])
    with db.exclusive(namespace) as lease:
        snap = thread.read()
        quiet = bool(job.get("flush")) or is_quiet(snap, ctx.formation_idle_s)
        chunks, seals = plan_chunks(snap, namespace, job["thread"], ctx.chunk_tokens, write_tail=quiet)
        if seals:
            lease.check()  # type: ignore[union-attr]
            thread.write(seal_ops(thread.ns, snap, seals))
    persona = state.get("persona") or snap.persona
    if chunks and not persona:
        raise ConfigurationError(f"thread {job['thread']!r} has pending turns but no persona: pass `persona` in the write graph's input")
    return {"chunks": chunks, "persona": persona}


def settle_pending(state: dict[str, Any], runtime: Any) -> dict[str, Any]:
    """Delete the pending turns whose chunks are applied; report what the thread still has pending."""
    db = context_of(runtime).dual(getattr(runtime, "store", None))
    namespace, job = tuple(state["namespace"]), state["pending"]
    thread = PendingThread(graph_store(getattr(runtime, "store", None) or db), namespace, job["thread"])
    applied = {r["chunk_id"] for r in state.get("report") or [] if r.get("status") in ("applied", "skipped")}
    done = [tid for chunk in state.get("chunks") or [] if chunk["id"] in applied for tid in chunk["turn_ids"]]
    with db.exclusive(namespace) as lease:
        snap = thread.read()
        ops = settle_ops(thread.ns, snap, done)
        if ops:
            lease.check()  # type: ignore[union-attr]
            thread.write(ops)
    left = [t for t in snap.turns if t["id"] not in set(done)]
    formed = {
        "thread": job["thread"], "written_turns": len(done), "pending_turns": len(left),
        "pending_tokens": sum(t["tokens"] for t in left), "newest_at": max((t["at"] for t in left), default=None),
    }  # fmt: skip
    return {"formed": formed}


# --------------------------------------------------------------------------- one run in this process


def formation_input(request: FormationRequest, *, flush: bool = False) -> dict[str, Any]:
    """Return the write graph's input that forms the thread's pending turns."""
    return {"persona": request.persona, "namespace": list(request.namespace), "pending": {"thread": request.thread, "flush": flush}}


def run_formation(request: FormationRequest, *, flush: bool = False) -> Formed:
    """Run the write graph on the thread's pending turns in this process (``flush``: write them all now)."""
    from dualmem.graphs.write import builder
    from dualmem.models import load_chat_model

    store = _store(request)
    model = None if request.writer_model is None else load_chat_model(request.writer_model, request.settings, role="writer")
    context = context_of(request.settings, models={"writer": model} if model is not None else None, store=store)
    graph = builder.compile(store=store)
    out = graph.invoke(formation_input(request, flush=flush), {"recursion_limit": 10_000}, context=context)  # type: ignore[call-overload]
    formed = out.get("formed") or {}
    return Formed(
        request.namespace, request.thread, list(out.get("report") or []), int(formed.get("pending_turns") or 0),
        int(formed.get("pending_tokens") or 0), formed.get("newest_at"),
    )  # fmt: skip


def persona_dict(persona: Persona | dict[str, Any]) -> dict[str, Any]:
    """Return a persona as the JSON dict formation requests carry."""
    return (persona if isinstance(persona, Persona) else Persona.model_validate(persona)).model_dump(mode="json")
