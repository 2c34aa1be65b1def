"""Pending chat turns: what a chat thread said that memory formation has not written yet.

They are ordinary items of the LangGraph store (the agent's ``runtime.store``)
under ``("dualmem_pending", persona, user, thread)`` (a ``.`` or ``%`` in a
label is percent-encoded, as store labels may not hold dots):

- one item per turn, keyed by the turn id: role, speaker, text, wall-clock
  time, token count, the user's earlier messages (read by the memory-poisoning
  guard) and ``seal``: the id of the chunk the turn was given to before the
  writer ran (None until then);
- ``thread``: the persona the thread talks to and its memory namespace, so any
  process can write the thread later;
- ``written``: the ids of the turns written last (a retried hand-over of the
  same messages adds nothing).

A turn is appended once (by id), sealed into a chunk under the namespace's
write lease, and deleted once that chunk is applied (:mod:`dualmem.chat.sealing`).
The pure core plans store operations; ``PendingThread`` runs them sync or async.
:func:`hand_over` is the one way in, for the respond graph and the chat middleware alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from langgraph.store.base import BaseStore, Item, PutOp, SearchOp
from typing_extensions import TypedDict

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.memory.guard import TurnFlag, flag_turns
from dualmem.models.tokens import count_tokens
from dualmem.schema import Persona, Turn, stable_id

PENDING_LABEL = "dualmem_pending"
THREAD_KEY, WRITTEN_KEY = "thread", "written"
WRITTEN_KEEP = 256  # ids of the latest written turns remembered per thread
READ_LIMIT = 100_000
EARLIER_MESSAGES = 4  # user messages before a turn kept for the guard, as the respond graph reads them


class PendingTurn(TypedDict):
    """One chat turn waiting for memory formation."""

    id: str
    role: str  # user | assistant
    speaker: str
    text: str
    at: float  # epoch seconds when it was handed over
    seq: int  # order within its hand-over
    tokens: int
    earlier: list[str]  # the user's messages before this one (user turns only)
    seal: str | None  # chunk id once sealed for the writer


def label(text: str) -> str:
    """Return ``text`` as a store namespace label (``%`` and ``.`` percent-encoded)."""
    return str(text).replace("%", "%25").replace(".", "%2E")


def pending_namespace(namespace: Sequence[str], thread: str) -> tuple[str, ...]:
    """Return the store namespace of a chat thread's pending turns."""
    return (PENDING_LABEL, *(label(part) for part in namespace), label(thread))


def new_turn(
    tid: str,
    role: str,
    text: str,
    *,
    speaker: str = "",
    earlier: Sequence[str] = (),
    at: float | None = None,
    seq: int = 0,
) -> PendingTurn:
    """Return a pending turn (its tokens counted now, off the writer's path)."""
    return PendingTurn(
        id=tid,
        role=role,
        speaker=speaker,
        text=text,
        at=time.time() if at is None else at,
        seq=seq,
        tokens=count_tokens(text),
        earlier=list(earlier)[-EARLIER_MESSAGES:] if role == "user" else [],
        seal=None,
    )


@dataclass
class Snapshot:
    """A thread's pending turns (oldest first), its persona and the ids written last."""

    turns: list[PendingTurn] = field(default_factory=list)
    persona: dict[str, Any] | None = None
    namespace: list[str] | None = None
    written: list[str] = field(default_factory=list)

    @property
    def unsealed_tokens(self) -> int:
        """Return the tokens of the turns not yet given to a chunk."""
        return sum(t["tokens"] for t in self.turns if not t["seal"])

    @property
    def newest_at(self) -> float | None:
        """Return when the newest pending turn was handed over (None when nothing is pending)."""
        return max((t["at"] for t in self.turns), default=None)


def snapshot(items: Iterable[Item]) -> Snapshot:
    """Return the snapshot held by a thread's store items."""
    snap = Snapshot()
    for item in items:
        if item.key == THREAD_KEY:
            snap.persona, snap.namespace = item.value.get("persona"), item.value.get("namespace")
        elif item.key == WRITTEN_KEY:
            snap.written = list(item.value.get("ids") or [])
        else:
            snap.turns.append(PendingTurn(**item.value))  # type: ignore[typeddict-item]
    snap.turns.sort(key=lambda t: (t["at"], t["seq"], t["id"]))
    return snap


def read_op(ns: tuple[str, ...]) -> SearchOp:
    """Return the store operation reading a thread's items."""
    return SearchOp(namespace_prefix=ns, filter=None, limit=READ_LIMIT)


def append_ops(
    ns: tuple[str, ...],
    current: Snapshot,
    turns: Sequence[PendingTurn],
    persona: dict[str, Any],
    namespace: Sequence[str],
) -> tuple[list[PutOp], Snapshot]:
    """Plan the hand-over of ``turns``: the ones neither pending nor written yet, and the thread record."""
    known = {t["id"] for t in current.turns} | set(current.written)
    fresh = [t for t in turns if t["id"] not in known]
    ops = [PutOp(ns, t["id"], dict(t), index=False) for t in fresh]
    if fresh or current.persona != persona:
        ops.append(PutOp(ns, THREAD_KEY, {"persona": persona, "namespace": list(namespace)}, index=False))
    after = Snapshot([*current.turns, *fresh], persona, list(namespace), current.written)
    return ops, after


def seal_ops(ns: tuple[str, ...], current: Snapshot, seals: dict[str, str]) -> list[PutOp]:
    """Plan the sealing of turns into chunks (turn id -> chunk id)."""
    return [
        PutOp(ns, t["id"], {**t, "seal": seals[t["id"]]}, index=False)
        for t in current.turns
        if t["id"] in seals and t["seal"] != seals[t["id"]]
    ]


def settle_ops(ns: tuple[str, ...], current: Snapshot, done: Sequence[str]) -> list[PutOp]:
    """Plan the removal of written turns (and remember their ids)."""
    gone = [t["id"] for t in current.turns if t["id"] in set(done)]
    if not gone:
        return []
    written = [*(i for i in current.written if i not in gone), *gone][-WRITTEN_KEEP:]
    return [*(PutOp(ns, tid, None) for tid in gone), PutOp(ns, WRITTEN_KEY, {"ids": written}, index=False)]


class PendingThread:
    """One chat thread's pending turns in a LangGraph store (sync and async shells over the core above)."""

    def __init__(self, store: BaseStore, namespace: Sequence[str], thread: str) -> None:
        self.store, self.namespace, self.thread = store, tuple(namespace), str(thread)
        self.ns = pending_namespace(self.namespace, self.thread)

    def read(self) -> Snapshot:
        """Return the thread's pending turns."""
        return snapshot(self.store.batch([read_op(self.ns)])[0])  # type: ignore[arg-type]

    async def aread(self) -> Snapshot:
        """Async :meth:`read`."""
        return snapshot((await self.store.abatch([read_op(self.ns)]))[0])  # type: ignore[arg-type]

    def append(self, turns: Sequence[PendingTurn], persona: dict[str, Any]) -> Snapshot:
        """Add the turns not seen yet; return what is pending now."""
        ops, after = append_ops(self.ns, self.read(), turns, persona, self.namespace)
        if ops:
            self.store.batch(ops)
        return after

    async def aappend(self, turns: Sequence[PendingTurn], persona: dict[str, Any]) -> Snapshot:
        """Async :meth:`append`."""
        ops, after = append_ops(self.ns, await self.aread(), turns, persona, self.namespace)
        if ops:
            await self.store.abatch(ops)
        return after

    def write(self, ops: Sequence[PutOp]) -> None:
        """Apply planned operations (seals, removals)."""
        if ops:
            self.store.batch(list(ops))


def graph_store(store: Any) -> BaseStore:
    """Return the LangGraph store view of a graph's store (a ``LanceDBStore``, or one over a ``DualStore``)."""
    from dualmem.stores.contract import DualStore
    from dualmem.stores.langgraph_store import langgraph_view

    if isinstance(store, DualStore):
        return langgraph_view(store)
    if isinstance(store, BaseStore):
        return store
    raise ConfigurationError(
        "chat memory needs the graph's store: compile the agent or graph with store=LanceDBStore.from_settings()"
    )


# --------------------------------------------------------------------------- the hand-over


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
class HandedOver:
    """What a hand-over did: the request scheduled, the thread's pending turns after it and their unsealed tokens
    (what decided whether the write runs at once), and the memory-poisoning guard's flags on the user's messages (the
    guard runs again when the turns are written)."""

    request: FormationRequest
    pending: Snapshot
    unsealed_tokens: int
    flags: list[TurnFlag]


def hand_over(
    persona: Persona,
    namespace: Sequence[str],
    thread: str,
    settings: Settings,
    store: Any,
    said: Sequence[tuple[str, str, str | None]],
    formation: Formation,
    earlier: Sequence[str] = (),
    writer_model: Any = None,
) -> HandedOver:
    """Hand an exchange's messages ``(role, text, message id)`` to memory formation: they join ``thread``'s pending
    turns in ``store`` (those not handed over before) and the thread's write is scheduled on ``formation`` — at once
    when its unsealed turns reach ``chunk_tokens``, else when it is quiet.

    Turn ids come from the message ids (a resumed run hands nothing over twice); each user turn keeps the user's
    messages before it (``earlier``, read by the memory-poisoning guard when the turns are written).
    """
    request, turns, flags = _handed(persona, namespace, thread, settings, store, said, earlier, writer_model)
    assert request.store is not None
    snap = PendingThread(request.store, request.namespace, thread).append(turns, request.persona)
    tokens = snap.unsealed_tokens
    formation.schedule(request, now=tokens >= settings.tuning.chunk_tokens)
    return HandedOver(request, snap, tokens, flags)


async def ahand_over(
    persona: Persona,
    namespace: Sequence[str],
    thread: str,
    settings: Settings,
    store: Any,
    said: Sequence[tuple[str, str, str | None]],
    formation: Formation,
    earlier: Sequence[str] = (),
    writer_model: Any = None,
) -> HandedOver:
    """Async :func:`hand_over` (turns are counted and checked in a worker thread: the tokenizer may load)."""
    request, turns, flags = await asyncio.to_thread(
        _handed, persona, namespace, thread, settings, store, said, earlier, writer_model
    )
    assert request.store is not None
    snap = await PendingThread(request.store, request.namespace, thread).aappend(turns, request.persona)
    tokens = snap.unsealed_tokens
    await formation.aschedule(request, now=tokens >= settings.tuning.chunk_tokens)
    return HandedOver(request, snap, tokens, flags)


def _handed(
    persona: Persona,
    namespace: Sequence[str],
    thread: str,
    settings: Settings,
    store: Any,
    said: Sequence[tuple[str, str, str | None]],
    earlier: Sequence[str],
    writer_model: Any,
) -> tuple[FormationRequest, list[PendingTurn], list[TurnFlag]]:
    turns, before = [], list(earlier)
    flags: list[TurnFlag] = []
    for seq, (role, text, message_id) in enumerate(said):
        tid = stable_id(thread, message_id or "", role, "" if message_id else text, prefix="t-")
        speaker = persona.name if role == "assistant" else ""
        turns.append(new_turn(tid, role, text, speaker=speaker, earlier=before, seq=seq))
        if role == "user":
            context = [Turn(id=f"earlier-{i}", role="user", text=t) for i, t in enumerate(turns[-1]["earlier"])]
            flags += flag_turns([Turn(id=tid, role="user", text=text)], context=context).values()
            before = [*before, text]
    request = FormationRequest(
        persona.model_dump(mode="json"), tuple(namespace), thread, settings, graph_store(store), writer_model
    )
    return request, turns, flags


def pending_threads(store: BaseStore, namespace: Sequence[str] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Return ``(memory namespace, thread)`` of every thread with pending turns (under ``namespace``, a prefix)."""
    prefix = (PENDING_LABEL, *(label(p) for p in namespace))
    found = []
    for ns in store.list_namespaces(prefix=prefix, limit=READ_LIMIT):
        if len(ns) >= 3 and tuple(ns[: len(prefix)]) == prefix:  # literal: a "*" in an id is no wildcard
            found.append((tuple(unquote(p) for p in ns[1:-1]), unquote(ns[-1])))
    return found
