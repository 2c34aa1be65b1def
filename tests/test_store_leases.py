"""Write leases: one writer per namespace across threads and processes; renewed while held, freed by a killed holder's TTL.

Real LanceDB on disk, real threads and processes; the lease table is read directly to see who holds a slot.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dualmem.errors import LeaseLost, LeaseTimeout
from dualmem.stores import InMemoryDualStore, LanceDualStore
from dualmem.testing import HashEmbeddings

NS = ("mara", "alice")
REPO = Path(__file__).resolve().parents[1]


def lance(uri: str, ttl: float = 60.0, wait: float = 30.0) -> LanceDualStore:
    return LanceDualStore(uri, HashEmbeddings(32), lease_ttl_s=ttl, lease_wait_s=wait)


def holder(uri: str) -> str:
    """Return the namespace's lease holder as a fresh connection sees it ('' when free)."""
    return lance(uri).leases.holder(NS)[0]


@pytest.mark.parametrize("backend", ["lancedb", "memory"])
def test_a_held_namespace_makes_another_writer_wait_then_give_up_or_time_out(tmp_path, backend):
    db = lance(str(tmp_path / "db")) if backend == "lancedb" else InMemoryDualStore(HashEmbeddings(32))
    order: list[str] = []
    inside = threading.Event()

    def other() -> None:
        inside.wait(5)
        with db.exclusive(NS, wait_s=10) as lease:
            assert lease is not None
            order.append("other")

    thread = threading.Thread(target=other)
    thread.start()
    with db.exclusive(NS):
        inside.set()
        time.sleep(0.4)
        order.append("first")
        with pytest.raises(LeaseTimeout):  # a third writer that waits too little fails, naming the namespace
            with db.exclusive(NS, wait_s=0.2):
                pass
        with db.exclusive(NS, give_up=lambda: True) as none:  # "my work was done by another writer"
            assert none is None
    thread.join(10)
    assert order == ["first", "other"]
    with db.exclusive(("mara", "bob"), wait_s=0.5) as lease:  # other namespaces never wait
        assert lease is not None


def test_a_lease_held_longer_than_its_ttl_is_renewed_and_released_after_the_block(tmp_path):
    uri = str(tmp_path / "db")
    db = lance(uri, ttl=0.6)
    with db.exclusive(NS) as lease:
        time.sleep(1.5)  # more than twice the TTL: the heartbeat renewed it
        assert holder(uri) == lease.owner
        lease.check()
        with pytest.raises(LeaseTimeout):
            with lance(uri, ttl=0.6).exclusive(NS, wait_s=0.5):
                pass
    assert holder(uri) == ""


def test_a_lease_taken_over_fails_the_check_before_a_commit(tmp_path):
    uri = str(tmp_path / "db")
    db = lance(uri, ttl=60.0)
    with db.exclusive(NS) as lease:
        db.leases.table.update(where="holder != ''", values={"holder": "someone-else"})  # another writer took it
        lease.renewed = 0.0  # our clock says it is due for renewal
        with pytest.raises(LeaseLost):
            lease.check()


def holding_process(uri: str, ttl: float) -> subprocess.Popen[str]:
    """Start a process that holds the namespace's lease (``ttl`` s) until killed; it prints "held" once it does."""
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from dualmem.stores import LanceDualStore
        from dualmem.testing import HashEmbeddings
        db = LanceDualStore({uri!r}, HashEmbeddings(32), lease_ttl_s={ttl!r}, lease_wait_s=5.0)
        with db.exclusive({NS!r}):
            print("held", flush=True)
            time.sleep(600)
        """
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_killed_holders_lease_frees_after_its_ttl(tmp_path):
    uri = str(tmp_path / "db")
    proc = holding_process(uri, ttl=1.0)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert holder(uri) != ""
        proc.kill()
        proc.wait(10)
        started = time.monotonic()
        with lance(uri, ttl=1.0, wait=10.0).exclusive(NS) as lease:
            assert lease is not None
        assert time.monotonic() - started < 5.0
    finally:
        proc.kill()


def test_a_killed_writer_of_this_host_is_taken_over_at_once_not_after_its_ttl(tmp_path):
    uri = str(tmp_path / "db")
    proc = holding_process(uri, ttl=60.0)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LeaseTimeout):  # alive: it keeps its namespace
            with lance(uri, ttl=60.0, wait=1.0).exclusive(NS):
                pass
        proc.kill()
        proc.wait(10)
        started = time.monotonic()
        with lance(uri, ttl=60.0, wait=30.0).exclusive(NS) as lease:
            assert lease is not None
        assert time.monotonic() - started < 5.0, "a gone process of this host holds nothing (TTL is 60 s)"
    finally:
        proc.kill()
