"""Write leases of the LanceDB backend: one writer at a time per namespace, across threads, processes and machines.

Each namespace has its own lease row in the table ``namespace_leases`` (``namespace`` key, ``holder``,
``expires``). Taking a lease reads that row and, when it is free, expired or ours, makes one conditional update
of it (``holder = '' OR expired OR mine`` -> me): LanceDB's optimistic commits let exactly one of several racing
updates through, on a local disk and on object storage alike; renewing and releasing are conditional on
``holder = me``. A held lease is renewed every ``ttl / 3`` by one heartbeat thread per held lease, because a
writer holds its namespace across a model call that may outlast the TTL; a writer killed with ``kill -9`` stops
renewing: its lease expires after ``ttl``, or at once for a writer of this host whose process is gone
(:func:`holder_gone`). The lease is released when the ``with`` block ends.

Invariants:

- **a waiting writer commits nothing**: an update is made only when the row read says it can succeed (LanceDB
  commits a new table version even for an update that matches no row), so polling a held lease costs reads, not
  versions or object-storage writes;
- **unrelated namespaces never wait on each other**: a lease is taken, renewed and released on its own row only;
- **one row per namespace**: LanceDB does not enforce keys (two processes adding one key both succeed), so a
  namespace's row is created once, lazily, under a *creation guard*: the old fixed table ``write_leases`` of
  ``SLOTS`` rows, a namespace mapping to a slot by hash (:func:`slot_of`). The creator takes its slot (a
  conditional update, held for milliseconds, never across a model call), reads whether the row exists, inserts
  it already held by itself if absent (a keyed ``merge_insert`` on the table's declared primary key: a second line
  against duplicates), and frees the slot. Namespaces sharing a slot wait on each other only while one of them is
  created — once per namespace;
- rows are deleted only while free, by ``forget`` (:mod:`dualmem.control.forget`); a writer that then finds no
  row creates it again.

Writers of an earlier DualMem, which hold the ``write_leases`` slot itself while writing, do not see these rows:
stop them before writers of this version write the same store.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.errors import LeaseLost, LeaseTimeout
from dualmem.stores._sql import ns_key, sql_str

TABLE = "write_leases"  # the creation guard: SLOTS rows, a namespace's slot by hash
SLOTS = 4096
SCHEMA = pa.schema(
    [
        pa.field("slot", pa.int64()),
        pa.field("holder", pa.string()),
        pa.field("expires", pa.float64()),
        pa.field("namespace", pa.string()),  # named by writers of earlier versions only (forget clears it)
    ]
)
NS_TABLE = "namespace_leases"  # one lease row per namespace
NS_SCHEMA = pa.schema(
    [
        pa.field("namespace", pa.string(), nullable=False),
        pa.field("holder", pa.string()),
        pa.field("expires", pa.float64()),
    ]
)


def new_owner(label: str = "") -> str:
    """Return a unique lease owner token (host, process, random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{label}{uuid.uuid4().hex[:12]}"


def holder_gone(holder: str) -> bool:
    """Return whether a lease holder is a process of this host that no longer runs (its lease need not expire first).

    A holder of another host, or a process id that runs again (reused), is never judged gone: its lease expires.
    """
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


def slot_of(namespace: Sequence[str]) -> int:
    """Return the lease slot of a namespace."""
    return int(hashlib.sha256(ns_key(namespace).encode()).hexdigest()[:12], 16) % SLOTS


class Lease:
    """A held lease, renewed by a heartbeat thread until released; ``check()`` fails once it is lost.

    ``waited_s``: the seconds its taker waited for other writers (from the first attempt to the one that took it;
    0.0 when the first attempt did).
    """

    def __init__(self, leases: Leases, namespace: Sequence[str], owner: str, waited_s: float = 0.0) -> None:
        self.leases, self.namespace, self.owner, self.waited_s = leases, tuple(namespace), owner, waited_s
        self.renewed = time.time()  # our clock when the lease was last taken or renewed
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"dualmem-lease-{owner[-6:]}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(max(self.leases.ttl_s / 3.0, 0.05)):
            self._renew()

    def _renew(self) -> bool:
        started = time.time()
        try:
            if self.leases.renew(self.namespace, self.owner):
                self.renewed = started
                return True
            self.lost.set()
        except Exception:  # noqa: BLE001 - a failed renewal is retried at the next beat; check() renews itself
            pass
        return False

    def check(self) -> None:
        """Raise LeaseLost unless the lease is surely still ours (a fence before committing).

        Nobody takes a lease before it expires, so with more than a third of the TTL left
        (by our clock) it is ours without asking; else it is renewed now.
        """
        if not self.lost.is_set() and time.time() - self.renewed < self.leases.ttl_s * 2 / 3:
            return
        if self.lost.is_set() or not self._renew():
            self.lost.set()
            raise LeaseLost(f"the write lease of {self.namespace} was lost (expired or taken over); nothing committed")

    def release(self) -> None:
        """Stop renewing and give the lease back (an unreleased lease simply expires)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.leases.release(self.namespace, self.owner)
        except Exception:  # noqa: BLE001 - it expires after the TTL
            pass


class Leases:
    """Namespace write leases: one LanceDB row per namespace (``rows``), created under the slot guard (``table``)."""

    def __init__(self, db: Any, *, ttl_s: float, wait_s: float, poll_s: float = 0.05) -> None:
        if ttl_s <= 0:
            raise ValueError("lease ttl must be positive seconds")
        self.ttl_s, self.wait_s, self.poll_s = float(ttl_s), float(wait_s), float(poll_s)
        data = pa.table(
            {"slot": list(range(SLOTS)), "holder": [""] * SLOTS, "expires": [0.0] * SLOTS, "namespace": [""] * SLOTS},
            schema=SCHEMA,
        )
        self.table = L.open_or_create(db, TABLE, SCHEMA, data=data)
        L.ensure_indexes(self.table, L.base_index_configs({"slot": "BTREE"}))
        self.rows = L.open_or_create(db, NS_TABLE, NS_SCHEMA)
        L.ensure_primary_key(self.rows, "namespace")
        L.ensure_indexes(self.rows, L.base_index_configs({"namespace": "BTREE"}))

    @property
    def tables(self) -> tuple[Any, Any]:
        """Both lease tables (the slot guard and the namespace rows), for maintenance."""
        return self.table, self.rows

    @staticmethod
    def _update(table: Any, where: str, values: dict[str, Any]) -> int:
        return int(L.retry(lambda: table.update(where=where, values=values)).rows_updated)

    def try_acquire(self, namespace: Sequence[str], owner: str) -> bool:
        """Take the namespace's lease if it is free, expired or already ours; return whether we hold it.

        One read of the namespace's own row, then — only when the lease looks takeable — one conditional update
        of it (the update's condition decides a race): a writer waiting for a held lease commits nothing. A
        namespace without a row yet gets it, held by ``owner``, from :meth:`_create`.
        """
        key = sql_str(ns_key(namespace))
        rows = L.query_rows(self.rows, f"namespace = {key}", ["holder", "expires"], 1)
        if not rows:
            return self._create(namespace, owner)
        who, now = rows[0]["holder"], time.time()
        values = {"holder": owner, "expires": now + self.ttl_s}
        if not who or who == owner or rows[0]["expires"] < now:
            where = f"namespace = {key} AND (holder = '' OR holder = {sql_str(owner)} OR expires < {now!r})"
            return self._update(self.rows, where, values) == 1
        if holder_gone(who):  # its process is gone from this host: taken over now
            return self._update(self.rows, f"namespace = {key} AND holder = {sql_str(who)}", values) == 1
        return False

    def _create(self, namespace: Sequence[str], owner: str) -> bool:
        """Create the namespace's lease row, held by ``owner``, under its slot's guard; False when the guard is busy
        (another namespace of the slot is being created) or the row appeared meanwhile: the caller tries again."""
        slot, guard = slot_of(namespace), new_owner("create-")
        guarded = L.query_rows(self.table, f"slot = {slot}", ["holder", "expires"], 1)[0]
        who, until = guarded["holder"], guarded["expires"]
        taken = time.time()
        values = {"holder": guard, "expires": taken + self.ttl_s, "namespace": ""}
        if not who or until < taken:
            where = f"slot = {slot} AND (holder = '' OR expires < {taken!r})"
        elif holder_gone(who):
            where = f"slot = {slot} AND holder = {sql_str(who)}"
        else:
            return False  # busy: another namespace of the slot is being created; nothing committed
        if self._update(self.table, where, values) != 1:
            return False
        mine = f"slot = {slot} AND holder = {sql_str(guard)}"
        try:
            key = ns_key(namespace)
            if L.query_rows(self.rows, f"namespace = {sql_str(key)}", ["holder"], 1):
                return False  # created meanwhile: the caller's next conditional update decides
            # fence: nobody takes the guard before it expires: within a third of its TTL it is ours, later renewed
            if (
                time.time() - taken > self.ttl_s / 3
                and self._update(self.table, mine, {"expires": time.time() + self.ttl_s}) != 1
            ):
                return False
            row = pa.table(
                {"namespace": [key], "holder": [owner], "expires": [time.time() + self.ttl_s]}, schema=NS_SCHEMA
            )
            L.retry(lambda: self.rows.merge_insert("namespace").when_not_matched_insert_all().execute(row))
        finally:
            self._update(self.table, mine, {"holder": "", "expires": 0.0})
        return self.holder(namespace)[0] == owner  # a row of another creator that won the key (never expected)

    def renew(self, namespace: Sequence[str], owner: str) -> bool:
        """Extend our lease; False when it is no longer ours."""
        where = f"namespace = {sql_str(ns_key(namespace))} AND holder = {sql_str(owner)}"
        return self._update(self.rows, where, {"expires": time.time() + self.ttl_s}) == 1

    def release(self, namespace: Sequence[str], owner: str) -> bool:
        """Give our lease back; False when it was no longer ours."""
        where = f"namespace = {sql_str(ns_key(namespace))} AND holder = {sql_str(owner)}"
        return self._update(self.rows, where, {"holder": "", "expires": 0.0}) == 1

    def holder(self, namespace: Sequence[str]) -> tuple[str, float]:
        """Return (holder, expiry epoch seconds) of the namespace's lease ('' when free or never taken)."""
        rows = L.query_rows(self.rows, f"namespace = {sql_str(ns_key(namespace))}", ["holder", "expires"], 1)
        return (rows[0]["holder"], rows[0]["expires"]) if rows else ("", 0.0)

    def acquire(
        self,
        namespace: Sequence[str],
        owner: str,
        wait_s: float | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> Lease | None:
        """Wait (up to ``wait_s``, default the store's) until the lease is ours and return it; None when ``give_up``
        answered True while waiting (say, "has another writer done my work?")."""
        limit = self.wait_s if wait_s is None else wait_s
        asked = attempted = time.monotonic()
        deadline = asked + limit
        delay = self.poll_s
        while not self.try_acquire(namespace, owner):
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
            attempted = time.monotonic()
        return Lease(self, namespace, owner, waited_s=attempted - asked)

    @contextmanager
    def hold(
        self,
        namespace: Sequence[str],
        owner: str | None = None,
        wait_s: float | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> Iterator[Lease | None]:
        """Hold the namespace's write lease for the ``with`` block (None when ``give_up`` ended the wait)."""
        lease = self.acquire(namespace, owner or new_owner(), wait_s, give_up)
        if lease is None:
            yield None
            return
        try:
            yield lease
        finally:
            lease.release()
