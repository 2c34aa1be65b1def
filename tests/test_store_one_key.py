"""One key, one item: puts of one (namespace, key) at the same time — parallel graph nodes, threads, async tasks,
processes, on a local folder and on object storage — leave exactly one item, and reads never show two.

Real LanceDB (and the in-memory stores where the API is the same); other processes are real ``python`` processes
(``tests/fixtures/store_worker.py``) started at one wall-clock instant.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pytest
from langgraph.graph import START, StateGraph
from langgraph.store.base import BaseStore
from typing_extensions import TypedDict

from dualmem.schema import Fact
from dualmem.stores import DualMemStore, InMemoryDualStore, LanceDBStore, LanceDualStore, langgraph_view
from dualmem.stores._rows import item_to_row
from dualmem.testing import HashEmbeddings

WORKER = Path(__file__).parent / "fixtures" / "store_worker.py"
REPO = Path(__file__).resolve().parents[1]
DIMS = 64
NS = ("mara", "alice")
MEMORY_NS = ("dualmem", "mara", "alice", "fact")


def _lance(uri: str) -> LanceDBStore:
    dual = LanceDualStore(uri, HashEmbeddings(DIMS), storage_options=os.environ.get("DUALMEM_STORE_OPTIONS") or None)
    return LanceDBStore.over(dual)


@pytest.fixture(params=["lancedb", "memory"])
def store(request, tmp_path) -> DualMemStore:
    if request.param == "memory":
        return langgraph_view(InMemoryDualStore(HashEmbeddings(DIMS)))
    return _lance(str(tmp_path / "db"))


def _keys_in(store: BaseStore, ns: tuple[str, ...]) -> list[str]:
    return sorted(i.key for i in store.search(ns, limit=1000))


@pytest.mark.parametrize("namespace", [("docs", "shared"), MEMORY_NS])
def test_parallel_graph_nodes_putting_one_key_leave_one_item(store, namespace):
    """LangGraph's own graph-level store test: five parallel nodes of one step each put the same key."""

    class State(TypedDict):
        count: Annotated[int, operator.add]

    def node(i: int):
        def put(state: State, *, store: BaseStore) -> dict:
            store.put(namespace, "doc", {"text": f"written by node {i}", "node": i})
            return {"count": 1}

        return put

    builder = StateGraph(State)
    for i in range(5):
        builder.add_node(f"n{i}", node(i))
        builder.add_edge(START, f"n{i}")
    graph = builder.compile(store=store)
    assert graph.invoke({"count": 0})["count"] == 5
    assert _keys_in(store, namespace) == ["doc"]
    for i in range(3):  # later puts of the key replace the one item
        store.put(namespace, "doc", {"text": f"sequential {i}"})
    items = store.search(namespace, limit=100)
    assert [i.key for i in items] == ["doc"] and items[0].value["text"] == "sequential 2"
    assert store.get(namespace, "doc").value["text"] == "sequential 2"
    store.delete(namespace, "doc")
    assert store.search(namespace) == [] and store.get(namespace, "doc") is None


def test_threads_putting_the_same_keys_at_once_leave_one_item_per_key(store):
    keys = [f"k{i}" for i in range(10)]
    barrier = threading.Barrier(4)

    def worker(w: int) -> None:
        barrier.wait()
        for key in keys:
            store.put(("docs", "shared"), key, {"text": f"{key} from thread {w}"})
            store.put(MEMORY_NS, key, {"text": f"{key} from thread {w}"})
            store.dual.upsert([Fact(id=f"d-{key}", namespace=NS, text=f"{key} from thread {w}")])

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _keys_in(store, ("docs", "shared")) == keys
    assert _keys_in(store, MEMORY_NS) == sorted(keys + [f"d-{k}" for k in keys])
    assert store.dual.count(NS) == 20 and len(store.dual.list(NS)) == 20


async def test_gathered_async_puts_of_the_same_keys_leave_one_item_per_key(store):
    keys = [f"k{i}" for i in range(8)]
    await asyncio.gather(
        *(store.aput(("docs", "async"), key, {"text": f"{key} {w}"}) for w in range(4) for key in keys)
    )
    await asyncio.gather(*(store.aput(MEMORY_NS, key, {"text": f"{key} {w}"}) for w in range(4) for key in keys))
    assert sorted(i.key for i in await store.asearch(("docs", "async"), limit=100)) == keys
    assert sorted(i.key for i in await store.asearch(MEMORY_NS, limit=100)) == keys


def test_interleaved_puts_and_deletes_of_one_key_end_with_one_item_or_none(store):
    barrier = threading.Barrier(4)

    def worker(w: int) -> None:
        barrier.wait()
        for n in range(12):
            if (n + w) % 3 == 2:
                store.delete(("docs", "shared"), "k")
                store.delete(MEMORY_NS, "k")
            else:
                store.put(("docs", "shared"), "k", {"text": f"{w}/{n}"})
                store.put(MEMORY_NS, "k", {"text": f"{w}/{n}"})

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ns in (("docs", "shared"), MEMORY_NS):
        found = store.search(ns, limit=100)
        got = store.get(ns, "k")
        assert len(found) <= 1 and (got is None) == (found == [])
        assert got is None or got.value == found[0].value


def _start(command: str, **args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), command, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


@pytest.fixture(params=["local", "s3"])
def uri(request, tmp_path, monkeypatch):
    """A fresh store URI: a local folder, or a prefix on an S3-compatible server (moto, loopback)."""
    if request.param == "local":
        return str(tmp_path / "db")
    s3 = request.getfixturevalue("s3_server")
    monkeypatch.setenv("DUALMEM_STORE_OPTIONS", s3["options_json"])  # this process and the workers it starts
    return f"s3://{s3['bucket']}/{request.node.name.replace('[', '-').rstrip(']')}-{time.time_ns()}"


@pytest.mark.parametrize("delete_every", [0, 2])
def test_processes_started_at_one_instant_putting_the_same_keys_leave_one_item_per_key(uri, delete_every):
    keys = [f"k{i}" for i in range(10)]
    _lance(uri)  # the store exists before the race (creating it at once is its own test)
    at = time.time() + 4.0
    rounds = 2 if delete_every else 1  # with deletes: a round of puts racing, then a round of deletes racing the puts
    procs = [
        _start("put_keys", uri=uri, start=at, tag=f"p{i}", keys=keys, rounds=rounds, delete_every=delete_every)
        for i in range(3)
    ]
    for proc in procs:
        _finish(proc)
    store = _lance(uri)
    for ns, prefixes in ((("kv", "shared"), [""]), (MEMORY_NS, ["d-", "m-"])):
        found = [i.key for i in store.search(ns, limit=1000)]
        assert len(found) == len(set(found)), f"two items for one key in {ns}: {sorted(found)}"
        if not delete_every:
            assert sorted(found) == sorted(p + k for p in prefixes for k in keys)
    rows = store.dual.table.search().where('namespace = \'["mara", "alice"]\'').limit(None).to_list()
    assert len({r["pk"] for r in rows}) == len(rows), "no key has two rows in the memory table"
    kv_rows = store.kv.items.search().limit(None).to_list()
    assert len({r["id"] for r in kv_rows}) == len(kv_rows), "no key has two rows in the key-value table"


def test_a_table_holding_duplicate_rows_reads_one_item_per_key_and_maintain_repairs_it(tmp_path):
    """Rows written by an earlier version: two rows of one key in the memory, key-value and ledger tables."""
    uri = str(tmp_path / "db")
    store = _lance(uri)
    dual = store.dual
    old, new = Fact(id="f1", namespace=NS, text="the older copy"), Fact(id="f1", namespace=NS, text="the newer copy")
    schema = pa.schema([dual.table.schema.field(n) for n in dual._schema.names])
    vec = HashEmbeddings(DIMS).embed_query("copy")
    rows = [item_to_row(it, vec, created_at=it.created_at, updated_at=it.created_at, dims=DIMS) for it in (old, new)]
    dual.table.add(pa.Table.from_pylist(rows, schema=schema))  # add(), not merge_insert: two rows of one key
    store.put(("docs",), "k", {"text": "first"})
    kv_row = store.kv.items.search().where("key = 'k'").limit(1).to_list()[0]
    store.kv.items.add(
        pa.Table.from_pylist(
            [
                {
                    **kv_row,
                    "value": json.dumps({"text": "a stale copy"}),
                    "updated_at": kv_row["updated_at"].replace(year=2000),
                }
            ],
            schema=store.kv.items.schema,
        )
    )
    assert dual.table.count_rows("pk LIKE '%f1'") == 2 and store.kv.items.count_rows("key = 'k'") == 2

    assert [i.text for i in dual.get(NS, ["f1"])] == ["the newer copy"]
    assert [i.text for i in dual.list(NS)] == ["the newer copy"] and dual.count(NS) == 1
    assert [h.item.text for h in dual.search(NS, "copy", mode="vector")] == ["the newer copy"]
    assert [h.item.text for h in dual.search(NS, "copy", mode="fts")] == ["the newer copy"]
    assert dual.scan(NS).num_rows == 1
    assert [i.key for i in store.search(MEMORY_NS)] == ["f1"] and store.get(MEMORY_NS, "f1").value[
        "text"
    ] == "the newer copy"
    assert [i.value["text"] for i in store.search(("docs",))] == ["first"] and store.get(("docs",), "k").value[
        "text"
    ] == "first"

    out = subprocess.run(
        [sys.executable, "-m", "dualmem.cli", "maintain", "--store", uri],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "DUALMEM_EMBEDDER": f"hash:{DIMS}"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 duplicate row(s) removed" in out.stdout
    assert dual.table.count_rows("pk LIKE '%f1'") == 1 and store.kv.items.count_rows("key = 'k'") == 1
    assert dual.get(NS, ["f1"])[0].text == "the newer copy" and store.get(("docs",), "k").value["text"] == "first"
