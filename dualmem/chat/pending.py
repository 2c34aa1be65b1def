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
write lease, and deleted once that chunk is applied (:mod:`dualmem.chat.formation`).
The pure core plans store operations; ``PendingThread`` runs them sync or async.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from langgraph.store.base import BaseStore, Item, PutOp, SearchOp
from typing_extensions import TypedDict

from dualmem.models.tokens import count_tokens

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


def pending_threads(store: BaseStore, namespace: Sequence[str] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Return ``(memory namespace, thread)`` of every thread with pending turns (under ``namespace``, a prefix)."""
    prefix = (PENDING_LABEL, *(label(p) for p in namespace))
    found = []
    for ns in store.list_namespaces(prefix=prefix, limit=READ_LIMIT):
        if len(ns) >= 3 and tuple(ns[: len(prefix)]) == prefix:  # literal: a "*" in an id is no wildcard
            found.append((tuple(_unlabel(p) for p in ns[1:-1]), _unlabel(ns[-1])))
    return found


def _unlabel(text: str) -> str:
    return unquote(text)
