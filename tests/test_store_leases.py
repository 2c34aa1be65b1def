"""Write leases that linger: a writer keeps a namespace between chunks, and gives it back when idle or exiting.

Real LanceDB on disk, real threads and processes; the lease table is read directly to see who holds a slot.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dualmem.stores import DualStore
from dualmem.stores.leases import LeaseTimeout
from dualmem.testing import HashEmbeddings

NS = ("mara", "alice")
REPO = Path(__file__).resolve().parents[1]


def store(uri: str, linger: float, ttl: float = 60.0) -> DualStore:
    return DualStore(uri, HashEmbeddings(32), lease_ttl_s=ttl, lease_wait_s=30.0, lease_linger_s=linger)


def holder(uri: str) -> str:
    """Return the namespace's lease holder as a fresh connection sees it ('' when free)."""
    return store(uri, 0.0).leases.holder(NS)[0]


def test_a_writer_keeps_the_lease_between_chunks_without_committing_and_releases_it_when_idle(tmp_path):
    uri = str(tmp_path / "db")
    db = store(uri, linger=0.4)
    with db.exclusive(NS) as first:
        pass
    assert holder(uri) == first.owner, "the lease lingers after the block"
    version = db.leases.table.version
    for _ in range(3):  # chunk after chunk: the same lease, and no take or release commit
        with db.exclusive(NS) as again:
            assert again is first
            again.check()
    assert db.leases.table.version == version
    deadline = time.monotonic() + 5
    while holder(uri) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder(uri) == "", "an idle lingering lease is released"
    with db.exclusive(NS) as later:
        assert later is not first and later.owner != first.owner


def test_linger_zero_releases_at_the_end_of_the_block(tmp_path):
    uri = str(tmp_path / "db")
    db = store(uri, linger=0.0)
    with db.exclusive(NS):
        assert holder(uri) != ""
    assert holder(uri) == ""


def test_a_block_with_its_own_owner_neither_leaves_nor_takes_a_lingering_lease(tmp_path):
    uri = str(tmp_path / "db")
    db = store(uri, linger=5.0)
    with db.exclusive(NS, owner="me-1"):
        pass
    assert holder(uri) == "", "an explicit owner releases at once"
    with db.exclusive(NS) as parked:
        pass
    with pytest.raises(LeaseTimeout):  # another owner does not take the lingering lease: it waits like anyone else
        with db.exclusive(NS, owner="me-2", wait_s=0.3):
            pass
    assert holder(uri) == parked.owner


def test_another_thread_of_the_process_takes_over_a_lingering_lease(tmp_path):
    db = store(str(tmp_path / "db"), linger=10.0)
    got: dict[str, object] = {}
    inside = threading.Event()

    def first() -> None:
        with db.exclusive(NS) as lease:
            got["first"] = lease
            inside.set()
            time.sleep(0.3)

    def second() -> None:
        inside.wait()
        start = time.monotonic()
        with db.exclusive(NS) as lease:
            got["second"], got["waited"] = lease, time.monotonic() - start

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got["second"] is got["first"], "the waiting thread adopted the lease the first one left"
    assert got["waited"] < 5, "it did not wait for the 10 s linger to pass"


WAITER = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {repo!r})
    from dualmem.stores import DualStore
    from dualmem.testing import HashEmbeddings
    db = DualStore({uri!r}, HashEmbeddings(32), lease_ttl_s=60.0, lease_wait_s=20.0, lease_linger_s={linger})
    start = time.monotonic()
    with db.exclusive(("mara", "alice")) as lease:
        took = time.monotonic() - start
    print(json.dumps({{"took": took, "owner": lease.owner}}))
    """
)


def run_writer(uri: str, linger: float) -> dict:
    done = subprocess.run([sys.executable, "-c", WAITER.format(repo=str(REPO), uri=uri, linger=linger)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_writer_of_another_process_gets_the_namespace_once_the_holder_is_idle(tmp_path):
    uri = str(tmp_path / "db")
    db = store(uri, linger=1.0)
    with db.exclusive(NS) as lease:
        pass
    other = run_writer(uri, linger=0.0)  # waits while ours lingers (renewed), then takes it
    assert other["owner"] != lease.owner
    assert other["took"] < 15, "the lingering lease was released after its linger, not after the 60 s ttl"


def test_a_process_that_exits_gives_its_lingering_lease_back_at_once(tmp_path):
    uri = str(tmp_path / "db")
    for _ in range(3):  # each writer exits holding a lingering lease (20 s: the ttl / 3 cap); the next need not wait
        run_writer(uri, linger=60.0)
        assert holder(uri) == "", "the exiting writer released its lingering lease"
    started = time.monotonic()
    with store(uri, linger=0.0).exclusive(NS, wait_s=2.0):
        pass
    assert time.monotonic() - started < 2


def test_a_forked_child_never_uses_the_lease_its_parent_left_lingering(tmp_path):
    uri = str(tmp_path / "db")
    db = store(uri, linger=10.0)
    with db.exclusive(NS) as lease:
        pass
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()

    def child() -> None:  # the parent's store object, copied by the fork, with the parent's lingering lease in it
        try:
            with db.exclusive(NS, wait_s=0.5):
                out.put("used the parent's lease")
        except LeaseTimeout:
            out.put("waited")

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(60)
    assert out.get(timeout=5) == "waited"
    assert holder(uri) == lease.owner, "the parent still holds it"
    with db.exclusive(NS) as again:
        assert again is lease
