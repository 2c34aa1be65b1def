"""Write leases: one writer per namespace across threads and processes; renewed while held, freed by a killed holder's TTL;
namespaces that share a creation-guard slot never wait on each other; racing creators make one lease row.

Real LanceDB on disk, real threads and processes; the lease tables are read directly to see who holds what.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest

from dualmem.errors import LeaseLost, LeaseTimeout
from dualmem.stores import InMemoryDualStore, LanceDualStore
from dualmem.stores._sql import ns_key, sql_str
from dualmem.stores.leases import slot_of
from dualmem.testing import HashEmbeddings

NS = ("mara", "alice")
REPO = Path(__file__).resolve().parents[1]


def lance(uri: str, ttl: float = 60.0, wait: float = 30.0, options: dict | None = None) -> LanceDualStore:
    return LanceDualStore(uri, HashEmbeddings(32), lease_ttl_s=ttl, lease_wait_s=wait, storage_options=options)


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
        db.leases.rows.update(where="holder != ''", values={"holder": "someone-else"})  # another writer took it
        lease.renewed = 0.0  # our clock says it is due for renewal
        with pytest.raises(LeaseLost):
            lease.check()


def holding_process(uri: str, ttl: float, ns: tuple[str, ...] = NS) -> subprocess.Popen[str]:
    """Start a process that holds ``ns``'s lease (``ttl`` s) until killed; it prints "held" once it does."""
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from dualmem.stores import LanceDualStore
        from dualmem.testing import HashEmbeddings
        db = LanceDualStore({uri!r}, HashEmbeddings(32), lease_ttl_s={ttl!r}, lease_wait_s=5.0)
        with db.exclusive({ns!r}):
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


def colliding_pair() -> tuple[tuple[str, str], tuple[str, str]]:
    """Return two namespaces of one creation-guard slot (found by brute force)."""
    seen: dict[int, tuple[str, str]] = {}
    for i in range(100_000):
        ns = ("mara", f"u{i}")
        if (slot := slot_of(ns)) in seen:
            return seen[slot], ns
        seen[slot] = ns
    raise AssertionError("no two namespaces share a slot")


def test_two_namespaces_of_one_slot_are_held_at_once_by_two_processes_without_waiting(tmp_path):
    uri = str(tmp_path / "db")
    first, second = colliding_pair()
    assert slot_of(first) == slot_of(second) and first != second
    proc = holding_process(uri, ttl=60.0, ns=first)  # creates its lease row, then holds it (for a "model call")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        db = lance(uri, ttl=60.0)
        for _ in range(2):  # the second namespace's row is created, then taken again: neither waits
            started = time.monotonic()
            with db.exclusive(second, wait_s=0.5) as lease:
                assert lease is not None and time.monotonic() - started < 0.5
                assert db.leases.holder(second)[0] == lease.owner
                held = db.leases.holder(first)[0]
                assert held and held != lease.owner, "the other process holds the other namespace meanwhile"
        slot = db.leases.table.search().where(f"slot = {slot_of(first)}").to_list()
        assert [r["holder"] for r in slot] == [""], "the shared slot guards creation only: free while both are held"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_many_processes_racing_for_a_new_namespace_take_turns_and_make_one_lease_row(tmp_path, request, where):
    uri, options, go, n = str(tmp_path / "db"), None, tmp_path / "go", 5
    if where == "s3":  # a prefix on the S3-compatible server (moto, loopback)
        s3 = request.getfixturevalue("s3_server")
        uri, options = f"s3://{s3['bucket']}/leases-race-{time.time_ns()}", s3["options"]
    code = textwrap.dedent(
        f"""
        import json, os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from dualmem.stores import LanceDualStore
        from dualmem.testing import HashEmbeddings
        db = LanceDualStore({uri!r}, HashEmbeddings(32), lease_ttl_s=60.0, lease_wait_s=120.0,
                            storage_options={options!r})
        print("ready", flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        with db.exclusive({NS!r}) as lease:
            start = time.time()
            time.sleep(0.2)
            lease.check()
            print(json.dumps([start, time.time()]), flush=True)
        """
    )
    lance(uri, options=options)  # the tables exist; the namespace has no lease row yet
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert lance(uri, options=options).leases.rows.count_rows() == 0
        go.touch()
        spans = sorted(json.loads(p.communicate(timeout=180)[0].strip().splitlines()[-1]) for p in procs)
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs)
    assert all(a[1] <= b[0] for a, b in pairwise(spans)), f"two processes held the namespace at once: {spans}"
    db = lance(uri, options=options)
    assert db.leases.rows.count_rows(f"namespace = {sql_str(ns_key(NS))}") == 1, "one lease row for the namespace"
    assert db.leases.holder(NS)[0] == ""


def lease_versions(uri: str) -> tuple[int, int]:
    """Return the table versions of the namespace lease rows and of the creation guard, as a fresh store sees them."""
    leases = lance(uri).leases
    return leases.rows.version, leases.table.version


def test_a_writer_waiting_for_a_held_namespace_commits_nothing_to_the_lease_tables(tmp_path):
    uri = str(tmp_path / "db")
    db, other = lance(uri), lance(uri)
    with db.exclusive(NS):
        before = lease_versions(uri)
        with pytest.raises(LeaseTimeout):  # a dozen polls of the held lease
            with other.exclusive(NS, wait_s=1.0):
                pass
        assert lease_versions(uri) == before  # LanceDB commits even an update that matches no row: none is made
    rows, guard = lease_versions(uri)  # the release: one commit
    with other.exclusive(NS, wait_s=5.0) as lease:  # free: taken with one conditional update
        assert lease is not None
        assert lease_versions(uri) == (rows + 1, guard)


@pytest.mark.parametrize("backend", ["lancedb", "memory"])
def test_a_writers_report_says_how_long_it_waited_for_another_writer(tmp_path, tmp_settings, backend):
    from dualmem.schema import Persona
    from dualmem.testing import FakeChatModel, editing_writer, synthetic_history
    from dualmem.writer import write_history

    emb = HashEmbeddings(32)
    db = LanceDualStore(str(tmp_path / "db"), emb) if backend == "lancedb" else InMemoryDualStore(emb)
    persona, ns = Persona(id="mara", name="Mara"), ("mara", "theo")

    def write(sessions: int) -> float:
        model = FakeChatModel(responses=[editing_writer], cycle=True)
        history = synthetic_history(sessions, 2)
        report = write_history(
            history, persona, settings=tmp_settings, model=model, store=db, namespace=ns, progress=False
        )
        return report.lease_wait_s

    assert write(1) == 0.0  # nobody else writes: the first attempt takes the lease
    waits: list[float] = []
    with db.exclusive(ns):  # another writer holds the namespace for a second
        writer = threading.Thread(target=lambda: waits.append(write(2)))
        writer.start()
        time.sleep(1.0)
    writer.join(60)
    assert 0.8 <= waits[0] < 30
