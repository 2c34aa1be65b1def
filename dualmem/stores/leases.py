"""Write leases: one writer at a time per namespace, across threads, processes and machines.

A lease lives in a small LanceDB table created once, atomically, with
``SLOTS`` rows; a namespace maps to a slot by hash. Taking a lease is one
conditional update (``holder = '' OR expired OR mine`` -> me): LanceDB's
optimistic commits let exactly one of several racing updates through, on a
local disk and on object storage alike (verified by the multi-process tests).
A held lease is renewed by a heartbeat thread every ``ttl / 3``; a writer
killed with ``kill -9`` stops renewing and its lease expires after ``ttl``.

A lease given back by a ``with`` block is kept for ``linger_s`` (renewed all
the while) before it is released: a writer writing chunk after chunk takes the
namespace once instead of committing a take and a release per chunk (two
LanceDB commits, most of a chunk's bookkeeping). Only this :class:`Leases`
object, in this process, picks a lingering lease up again; a waiting writer of
another process gets the namespace once it has been idle for ``linger_s``, or
when the process exits.

Two namespaces that hash to the same slot share a lease: they take turns,
which costs waiting, never correctness (4,096 slots: two writers collide with
probability 1/4,096).
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.util import Finalize
from typing import Any

import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.errors import DualMemError
from dualmem.stores._sql import ns_key, sql_str

TABLE = "write_leases"
SLOTS = 4096
SCHEMA = pa.schema(
    [
        pa.field("slot", pa.int64()),
        pa.field("holder", pa.string()),
        pa.field("expires", pa.float64()),
        pa.field("namespace", pa.string()),
    ]
)


class LeaseTimeout(DualMemError):
    """Another writer held the namespace's lease for longer than we were willing to wait."""


class LeaseLost(DualMemError):
    """This writer's lease expired or was taken over before its work was committed."""


def new_owner(label: str = "") -> str:
    """Return a unique lease owner token (host, process, random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{label}{uuid.uuid4().hex[:12]}"


def slot_of(namespace: Sequence[str]) -> int:
    """Return the lease slot of a namespace."""
    return int(hashlib.sha256(ns_key(namespace).encode()).hexdigest()[:12], 16) % SLOTS


class Lease:
    """A held lease: renewed in the background until released; ``check()`` fails once it is lost."""

    def __init__(self, leases: Leases, namespace: Sequence[str], owner: str) -> None:
        self.leases, self.namespace, self.owner = leases, tuple(namespace), owner
        self.renewed = time.time()  # our clock when the lease was last taken or renewed
        self.pid = os.getpid()  # a forked child never uses its parent's lease
        self.parked_at: float | None = None  # monotonic time it was given back to linger (None: in use)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{owner[-6:]}", daemon=True)

    def _beat(self) -> None:
        interval = max(self.leases.ttl_s / 3.0, 0.05)
        while not self._stop.wait(interval):
            self._renew()

    def _renew(self) -> bool:
        started = time.time()
        try:
            if self.leases.renew(self.namespace, self.owner):
                self.renewed = started
                return True
            self.lost.set()
        except Exception:  # noqa: BLE001 - a failed renewal means the lease may lapse
            pass
        return False

    def check(self) -> None:
        """Raise LeaseLost unless the lease is surely still ours (a fence before committing).

        Nobody takes a lease before it expires, so with more than a third of the TTL left
        (by our clock, renewed in the background) it is ours without asking; else it is renewed now.
        """
        if not self.lost.is_set() and time.time() - self.renewed < self.leases.ttl_s * 2 / 3:
            return
        if self.lost.is_set() or not self._renew():
            self.lost.set()
            raise LeaseLost(f"the write lease of {self.namespace} was lost (expired or taken over); nothing committed")

    def _start(self) -> None:
        self._thread.start()

    def _stop_beat(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class Leases:
    """Namespace write leases stored in a LanceDB table of fixed slots."""

    def __init__(self, db: Any, *, ttl_s: float, wait_s: float, poll_s: float = 0.05, linger_s: float = 0.0) -> None:
        if ttl_s <= 0:
            raise ValueError("lease ttl must be positive seconds")
        if linger_s < 0:
            raise ValueError("lease linger must be >= 0 seconds")
        self.ttl_s, self.wait_s, self.poll_s = float(ttl_s), float(wait_s), float(poll_s)
        self.linger_s = min(float(linger_s), self.ttl_s / 3)
        self._parked: dict[tuple[str, ...], Lease] = {}
        self._parked_lock = threading.Lock()
        self._releasing = threading.Lock()
        self._released_at = 0.0  # monotonic time of the last release by this object
        _ALL.add(self)
        self._reaper: threading.Thread | None = None
        self._reaper_pid = 0
        self._exit_hook = False
        data = pa.table(
            {"slot": list(range(SLOTS)), "holder": [""] * SLOTS, "expires": [0.0] * SLOTS, "namespace": [""] * SLOTS},
            schema=SCHEMA,
        )
        self.table = L.open_or_create(db, TABLE, SCHEMA, data=data)
        L.ensure_indexes(self.table, L.base_index_configs({"slot": "BTREE"}))
        self._maintain = L.AutoOptimize()

    # ------------------------------------------------------------------ primitives

    def _update(self, where: str, values: dict[str, Any]) -> int:
        result = L.retry(lambda: self.table.update(where=where, values=values))
        self._maintain.committed(self.table)  # every update adds a small fragment and a version
        return int(getattr(result, "rows_updated", 0))

    def try_acquire(self, namespace: Sequence[str], owner: str) -> bool:
        """Take the namespace's lease if it is free, expired or already ours; return whether we hold it."""
        now = time.time()
        where = (
            f"slot = {slot_of(namespace)} AND (holder = '' OR holder = {sql_str(owner)} OR expires < {now!r})"
        )
        return self._update(where, {"holder": owner, "expires": now + self.ttl_s, "namespace": ns_key(namespace)}) == 1

    def renew(self, namespace: Sequence[str], owner: str) -> bool:
        """Extend our lease; False when it is no longer ours."""
        where = f"slot = {slot_of(namespace)} AND holder = {sql_str(owner)}"
        return self._update(where, {"expires": time.time() + self.ttl_s}) == 1

    def release(self, namespace: Sequence[str], owner: str) -> bool:
        """Give our lease back; False when it was no longer ours."""
        where = f"slot = {slot_of(namespace)} AND holder = {sql_str(owner)}"
        return self._update(where, {"holder": "", "expires": 0.0}) == 1

    def holder(self, namespace: Sequence[str]) -> tuple[str, float]:
        """Return (holder, expiry epoch seconds) of the namespace's slot ('' when free)."""
        rows = L.query_rows(self.table, f"slot = {slot_of(namespace)}", ["holder", "expires"], 1)
        return (rows[0]["holder"], rows[0]["expires"]) if rows else ("", 0.0)

    # ------------------------------------------------------------------ holding

    def acquire(
        self, namespace: Sequence[str], owner: str, wait_s: float | None = None, give_up: Callable[[], bool] | None = None,
        adopt: Callable[[], Lease | None] | None = None,
    ) -> Lease | None:  # fmt: skip
        """Wait (up to ``wait_s``, default the store's) until the lease is ours; return it, renewing.

        ``give_up`` is asked while waiting (say, "has another writer done my work?"): when it
        answers True the wait ends without the lease and None is returned. ``adopt`` is asked
        too: a lease it returns (one that another thread of this process left lingering) is taken over.
        """
        limit = self.wait_s if wait_s is None else wait_s
        deadline = time.monotonic() + limit
        delay = self.poll_s
        while not self.try_acquire(namespace, owner):
            if adopt is not None and (adopted := adopt()) is not None:
                return adopted
            if give_up is not None and give_up():
                return None
            if time.monotonic() >= deadline:
                who, until = self.holder(namespace)
                raise LeaseTimeout(
                    f"namespace {tuple(namespace)} is being written by {who or 'another writer'} "
                    f"(lease until {time.strftime('%H:%M:%S', time.localtime(until))}); waited {limit:.0f} s. "
                    "Let that writer finish, or raise lease_wait_s (DUALMEM_LEASE_WAIT_S)"
                )
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 1.5, 0.5)
        lease = Lease(self, namespace, owner)
        lease._start()
        return lease

    @contextmanager
    def hold(
        self, namespace: Sequence[str], owner: str | None = None, wait_s: float | None = None, give_up: Callable[[], bool] | None = None
    ) -> Iterator[Lease | None]:
        """Hold the namespace's write lease for the ``with`` block (renewed meanwhile; after it, kept ``linger_s``, then released).

        The block gets None instead of a lease when ``give_up`` ended the wait. A block
        with its own ``owner`` neither picks up a lingering lease nor leaves one.
        """
        key = tuple(namespace)
        lease = self._unpark(key) if owner is None else None
        if lease is None:
            adopt = None if owner is not None else (lambda: self._unpark(key))
            lease = self.acquire(namespace, owner or new_owner(), wait_s, give_up, adopt)
        if lease is None:
            yield None
            return
        try:
            yield lease
        finally:
            if owner is not None or not self._park(key, lease):
                self._let_go(lease)

    # ------------------------------------------------------------------ lingering

    def _let_go(self, lease: Lease) -> None:
        lease._stop_beat()
        try:
            self.release(lease.namespace, lease.owner)
        except Exception:  # noqa: BLE001 - an unreleased lease simply expires
            pass
        self._released_at = time.monotonic()

    def _unpark(self, key: tuple[str, ...]) -> Lease | None:
        """Return this process's lingering lease of ``key``, taken out of the lot (None: none usable)."""
        with self._parked_lock:
            lease = self._parked.pop(key, None)
        if lease is None:
            return None
        if lease.pid == os.getpid() and not lease.lost.is_set() and time.time() - lease.renewed < self.ttl_s * 2 / 3:
            lease.parked_at = None
            return lease
        if lease.pid == os.getpid():
            self._let_go(lease)
        return None

    def _park(self, key: tuple[str, ...], lease: Lease) -> bool:
        """Keep ``lease`` for ``linger_s``; False when it should be released now."""
        if self.linger_s <= 0 or lease.lost.is_set() or lease.pid != os.getpid():
            return False
        lease.parked_at = time.monotonic()
        with self._parked_lock:
            earlier = self._parked.get(key)
            self._parked[key] = lease
            if self._reaper is None or not self._reaper.is_alive() or self._reaper_pid != os.getpid():
                self._reaper_pid = os.getpid()
                self._reaper = threading.Thread(target=_reap, args=(weakref.ref(self),), name="lease-linger", daemon=True)
                self._reaper.start()
            if not self._exit_hook:  # at exit, also of a multiprocessing worker (which skips atexit)
                self._exit_hook = True
                Finalize(self, _release_parked, args=(weakref.ref(self),), exitpriority=10)
        if earlier is not None and earlier is not lease:
            self._let_go(earlier)
        return True

    def release_parked(self, older_than: float = 0.0) -> int:
        """Release this process's lingering leases idle for ``older_than`` seconds or more; return how many."""
        with self._releasing:  # taking them out and releasing them is one step: exit waits for a release under way
            now, pid = time.monotonic(), os.getpid()
            with self._parked_lock:
                for key in [k for k, v in self._parked.items() if v.pid != pid]:  # a forked parent's: not ours to release
                    del self._parked[key]
                due = [k for k, v in self._parked.items() if now - (v.parked_at or now) >= older_than]
                leases = [self._parked.pop(k) for k in due]
            for lease in leases:
                self._let_go(lease)
        return len(leases)


_ALL: weakref.WeakSet[Leases] = weakref.WeakSet()


def _forget_parked_after_fork() -> None:
    """In a forked child: its parent's lingering leases are not its own, and a lock held at the fork would never open."""
    for leases in list(_ALL):
        leases._parked, leases._reaper, leases._exit_hook = {}, None, False
        leases._parked_lock, leases._releasing = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_parked_after_fork)


def _reap(ref: weakref.ref[Leases]) -> None:
    """Release lingering leases once idle for ``linger_s`` (runs while the :class:`Leases` object lives and holds any)."""
    while (leases := ref()) is not None:
        interval = max(leases.linger_s / 4, 0.02)
        leases.release_parked(leases.linger_s)
        with leases._parked_lock:
            if not leases._parked:
                leases._reaper = None
                return
        del leases
        time.sleep(interval)


def _release_parked(ref: weakref.ref[Leases]) -> None:
    """At exit (or when the object goes): give lingering leases back now, so other writers need not wait for them to expire."""
    if (leases := ref()) is not None:
        leases.release_parked()
        # LanceDB's runtime threads finish a commit's Python callbacks a moment after it returns; one still
        # doing so when the interpreter finalizes aborts the process (measured: 1 exit in 16 without this wait)
        time.sleep(max(0.0, leases._released_at + 0.05 - time.monotonic()))
