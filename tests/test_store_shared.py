"""Shared use: several real processes on one LanceDB store (DESIGN.md: fresh, exactly once, isolated).

Other processes are real ``python`` processes (``tests/fixtures/store_worker.py``)
or the ``dualmem`` command; the store is a real folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualmem.retrieval import DualMemRetriever, create_search_memory_tool
from dualmem.schema import Fact, Insight
from dualmem.stores import LanceDBStore, LanceDualStore
from dualmem.testing import HashEmbeddings

WORKER = Path(__file__).parent / "fixtures" / "store_worker.py"


def dual_at(uri: str) -> LanceDualStore:
    """Open the store at ``uri`` with the object-store options the ``uri`` fixture put in the environment."""
    return LanceDualStore(uri, HashEmbeddings(64), storage_options=os.environ.get("DUALMEM_STORE_OPTIONS") or None)


NS = ("mara", "alice")


@pytest.fixture(params=["local", "s3"])
def uri(request, tmp_path, monkeypatch):
    """A fresh store URI: a local folder, or a prefix on an S3-compatible server (moto, loopback)."""
    if request.param == "local":
        return str(tmp_path / "db")
    s3 = request.getfixturevalue("s3_server")
    monkeypatch.setenv("DUALMEM_STORE_OPTIONS", s3["options_json"])  # this process and the workers it starts
    return f"s3://{s3['bucket']}/{request.node.name.replace('[', '-').rstrip(']')}-{time.time_ns()}"


def run(command: str, **args) -> dict:
    """Run the worker process to completion and return its JSON result."""
    return finish(start(command, **args))


def start(command: str, **args) -> subprocess.Popen:
    """Start the worker process (it inherits the environment, so DUALMEM_STORE_OPTIONS reaches it)."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), command, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_reader_opened_before_another_process_writes_sees_it_through_every_read_api(uri, tmp_path):
    dual = dual_at(uri)
    graph_store = LanceDBStore(uri, dual=dual_at(uri))
    retriever = DualMemRetriever(store=dual, namespace=NS, k=5)
    tool = create_search_memory_tool(NS, store=dual)
    # warm every read path (and the in-RAM namespace views) on an empty namespace
    assert dual.count(NS) == 0 and dual.search(NS, "tea", mode="vector") == [] and retriever.invoke("tea") == []
    assert graph_store.search(("dualmem", *NS), query="tea") == [] and graph_store.get(("notes", "alice"), "k") is None

    facts = [
        {"id": "f1", "text": "drinks green tea every morning"},
        {"id": "f2", "text": "plays chess on sundays"},
        {"id": "f3", "text": "grows tomatoes on the balcony"},
    ]
    run(
        "write",
        uri=uri,
        ns=list(NS),
        facts=facts,
        kv=[{"ns": ["notes", "alice"], "key": "k", "value": {"text": "likes tea"}}],
    )

    assert dual.count(NS) == 3 and {i.id for i in dual.list(NS)} == {"f1", "f2", "f3"}
    assert [i.text for i in dual.get(NS, ["f2"])] == ["plays chess on sundays"]
    for mode in ("vector", "hybrid", "fts"):
        assert dual.search(NS, "green tea", k=1, mode=mode)[0].item.id == "f1", mode
    assert NS in dual.namespaces() and dual.search(NS, "chess", kind="fact", k=1)[0].item.id == "f2"
    assert retriever.invoke("tomatoes balcony")[0].metadata["id"] == "f3"
    assert json.loads(tool.invoke({"query": "chess sundays", "limit": 1}))[0]["id"] == "f2"
    assert graph_store.get(("notes", "alice"), "k").value == {"text": "likes tea"}
    assert graph_store.search(("dualmem", *NS, "fact"), query="green tea", limit=1)[0].key == "f1"
    assert ("dualmem", *NS, "fact") in graph_store.list_namespaces() and (
        "notes",
        "alice",
    ) in graph_store.list_namespaces()

    run("change", uri=uri, ns=list(NS), supersede=["f1"], delete=["f3"])
    assert dual.count(NS) == 1 and dual.count(NS, status=None) == 2
    assert {h.item.id for h in dual.search(NS, "green tea tomatoes chess", k=5, mode="vector")} == {"f2"}
    assert {d.metadata["id"] for d in retriever.invoke("green tea tomatoes chess")} == {"f2"}


def test_several_processes_create_a_fresh_store_at_once(uri, tmp_path):
    at = time.time() + 6  # every process is started and imported by then: they open the store together
    procs = [start("open", uri=uri, start=at, tag=f"w{i}") for i in range(4)]
    assert all(finish(p)["ok"] for p in procs)
    dual = dual_at(uri)
    assert sorted(dual.namespaces()) == [("p", f"w{i}") for i in range(4)]
    store = LanceDBStore(uri, dual=dual)
    assert sorted(store.list_namespaces(prefix=("kv",))) == [("kv", f"w{i}") for i in range(4)]
    assert dual.leases.table.count_rows() == 4096  # the lease slots were created once


def test_two_writers_of_one_namespace_apply_every_chunk_exactly_once(uri, tmp_path):
    n = 6 if uri.startswith("s3://") else 12  # object-store commits are slower
    common = {"uri": uri, "persona": "mara", "user": "alice", "sessions": n, "delay": 0.2}
    a = start("ingest", checkpoint=str(tmp_path / "a.sqlite"), **common)
    b = start("ingest", checkpoint=str(tmp_path / "b.sqlite"), **common)
    ra, rb = finish(a), finish(b)
    assert ra["calls"] + rb["calls"] == n, "each chunk was drafted by one writer only"
    applied = [x for x, y in zip(ra["status"], rb["status"], strict=True) if (x, y).count("applied") == 1]
    assert len(applied) == n, (ra["status"], rb["status"])
    dual = dual_at(uri)
    assert dual.count(NS, kind="fact", status=None) == n and dual.count(NS, kind="insight", status=None) == n
    assert len(dual.ledger.applied_ids(NS)) == n and dual.ledger.look(NS, "")[1] == []
    rows = dual.ledger.table.search().where('namespace = \'["mara", "alice"]\'').limit(None).to_list()
    assert len(rows) == n, "one ledger row per chunk"
    facts = dual.table.search().where("kind = 'fact'").limit(None).to_list()
    assert len({r["pk"] for r in facts}) == len(facts) == n, "no row written twice"


def test_kill_9_of_a_writer_while_another_process_reads_loses_and_duplicates_nothing(uri, tmp_path):
    stop = tmp_path / "stop"
    common = {"uri": uri, "persona": "mara", "user": "alice", "sessions": 10, "ttl": 2.0}
    run("write", uri=uri, ns=list(NS), facts=[{"id": "seed", "text": "seed fact"}])
    reader = start("read", uri=uri, ns=list(NS), stop=str(stop))
    writer = start("ingest", checkpoint=str(tmp_path / "a.sqlite"), delay=0.3, **common)
    dual = dual_at(uri)
    deadline = time.time() + 120
    while len(dual.ledger.applied_ids(NS)) < 3 and time.time() < deadline:
        time.sleep(0.1)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    killed_at = len(dual.ledger.applied_ids(NS))
    assert 3 <= killed_at < 10
    t0 = time.time()
    resumed = run("ingest", checkpoint=str(tmp_path / "b.sqlite"), delay=0.0, **common)
    assert time.time() - t0 < 60, "the killed writer's lease expired and was taken over"
    stop.touch()
    seen = finish(reader)
    assert seen["errors"] == [] and seen["reads"] > 10
    assert seen["seen"] == sorted(seen["seen"]), "a reader never saw memory shrink"
    assert resumed["calls"] <= 10 - killed_at + 1  # only chunks not applied (and a drafted-but-lost one) asked again
    assert len(dual.ledger.applied_ids(NS)) == 10 and dual.ledger.look(NS, "")[1] == []
    assert dual.count(NS, kind="fact") == 11 and dual.count(NS, kind="insight") == 10  # + the seed fact


def test_two_users_of_one_persona_ingested_at_once_each_get_exactly_their_memory(uri, tmp_path):
    common = {"uri": uri, "persona": "mara", "sessions": 6, "delay": 0.02}
    a = start("ingest", checkpoint=str(tmp_path / "a.sqlite"), user="alice", **common)
    b = start("ingest", checkpoint=str(tmp_path / "b.sqlite"), user="bob", **common)
    ra, rb = finish(a), finish(b)
    assert ra["status"] == ["applied"] * 6 and rb["status"] == ["applied"] * 6, "same chunks, separate namespaces"
    dual = dual_at(uri)
    for user in ("alice", "bob"):
        items = dual.list(("mara", user), status=None)
        assert len(items) == 12 and {i.namespace for i in items} == {("mara", user)}
    alice_ids = {i.id for i in dual.list(("mara", "alice"))}
    assert not alice_ids & {i.id for i in dual.list(("mara", "bob"))}, "ids include the namespace"
    hits = dual.search(("mara", "bob"), "topic0 detail0x0", k=20, mode="hybrid")
    assert hits and all(h.item.namespace == ("mara", "bob") for h in hits)


def test_cli_ingest_takes_the_user_from_the_caller_and_the_data(tmp_path):
    sample = Path(__file__).resolve().parents[1] / "dualmem" / "data" / "sample_dialogue.json"
    env = {
        **os.environ,
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_STORE_URI": str(tmp_path / "db"),
        "DUALMEM_CHECKPOINT_PATH": str(tmp_path / "ck.sqlite"),
        "DUALMEM_CHUNK_TOKENS": "200",
    }
    from dualmem.datasets import load_sample

    cmd = [sys.executable, "-m", "dualmem.cli", "ingest", str(sample)]
    procs = [
        subprocess.Popen([*cmd, "--user", u], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for u in ("ann", "ben")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    dual = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    persona = load_sample().dialogue.persona.id
    assert dual.namespaces() == [(persona, "ann"), (persona, "ben")]
    counts = [dual.count((persona, u), status=None) for u in ("ann", "ben")]
    assert counts[0] == counts[1] > 0, "each user got the whole history, once"
    # without --user, the dialogue's own user id is the namespace
    plain = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert (persona, load_sample().dialogue.user_id) in dual.namespaces()


def test_two_cli_ingests_of_one_history_into_one_store_write_each_chunk_once(tmp_path):
    """The issue's own repro: two `dualmem ingest` of the same history at once, sharing the default checkpoint file."""
    sample = Path(__file__).resolve().parents[1] / "dualmem" / "data" / "sample_dialogue.json"
    env = {
        **os.environ,
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_STORE_URI": str(tmp_path / "db"),
        "DUALMEM_CHECKPOINT_PATH": str(tmp_path / "ck.sqlite"),
        "DUALMEM_CHUNK_TOKENS": "200",
    }
    from dualmem.datasets import load_sample
    from dualmem.memory.chunking import chunk_sessions

    item = load_sample()
    cmd = [sys.executable, "-m", "dualmem.cli", "ingest", str(sample)]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    ns = (item.dialogue.persona.id, item.dialogue.user_id)
    dual = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    chunks = chunk_sessions(item.dialogue, ns, 200, skip_queries=True)
    facts, insights = dual.list(ns, kind="fact", status=None), dual.list(ns, kind="insight", status=None)
    assert len(chunks) > 2 and len(facts) == len(insights) == len(chunks), (
        "fake:memory writes one fact and one insight per chunk"
    )
    assert len({f.source.chunk_id for f in facts}) == len(chunks), "every chunk applied once"
    assert len(dual.ledger.applied_ids(ns)) == len(chunks) and dual.ledger.look(ns, "")[1] == []


def test_nothing_crosses_namespaces(tmp_path):
    from dualmem.errors import ConfigurationError
    from dualmem.retrieval import create_manage_memory_tool

    uri = str(tmp_path / "db")
    dual = dual_at(uri)
    alice, bob = ("mara", "alice"), ("mara", "bob")
    dual.upsert(
        [
            Fact(id="x1", namespace=bob, text="bob's secret: allergic to cats"),
            Insight(id="y1", namespace=bob, text="bob needs care", grounding=["x1"]),
        ]
    )
    assert dual.get(alice, ["x1", "y1"]) == []
    dual.delete(alice, ["x1"])
    dual.supersede(alice, ["y1"])
    assert dual.count(bob) == 2, "deletes and supersedes of another namespace's ids do nothing"
    dual.upsert([Fact(id="x1", namespace=alice, text="alice's own fact")])  # the same id in another namespace
    assert (
        dual.get(bob, ["x1"])[0].text.startswith("bob's secret")
        and dual.get(alice, ["x1"])[0].text == "alice's own fact"
    )
    manage = create_manage_memory_tool(alice, store=dual)
    with pytest.raises(ValueError, match="no memory 'y1' in this namespace"):
        manage.invoke({"action": "delete", "id": "y1"})
    with pytest.raises(ValueError, match="no memory 'y1' in this namespace"):
        manage.invoke({"action": "update", "id": "y1", "content": "moved"})
    assert dual.get(bob, ["y1"])[0].text == "bob needs care"
    store = LanceDBStore(uri, dual=dual)
    with pytest.raises(ConfigurationError, match="not facts of"):
        store.put(("dualmem", *alice, "insight"), "z", {"text": "cites bob", "grounding": ["x2"]})
    store.put(("dualmem", *alice, "fact"), "y1", {"text": "alice's y1"})
    assert dual.get(bob, ["y1"])[0].kind == "insight", "a put in alice's namespace never moves bob's item"
    # filters are structured: no input widens them
    hostile = "x') OR (1=1"
    assert dual.search(alice, "secret cats", filter={"session_id": hostile}, mode="vector") == []
    assert dual.search(alice, "secret cats", filter={"session_id": {"$in": [hostile, "s' OR '1'='1"]}}) == []
    with pytest.raises(ConfigurationError, match="cannot filter on"):
        dual.search(alice, "x", filter={"namespace": '["mara", "bob"]'})
    assert {h.item.namespace for h in dual.search(alice, "secret cats allergic", k=10)} == {alice}
