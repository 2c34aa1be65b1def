"""LanceDBStore specifics: persistence, graphs, the `langgraph dev` loader."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from dualmem.errors import ConfigurationError
from dualmem.schema import Fact
from dualmem.stores.langgraph_store import LanceDBStore, make_store
from dualmem.testing import HashEmbeddings


def index(dims=32):
    return {"dims": dims, "embed": HashEmbeddings(dims), "fields": ["text"]}


def test_items_persist_across_reopen(tmp_path):
    uri = str(tmp_path / "db")
    first = LanceDBStore(uri, index=index())
    first.put(("u", "prefs"), "tea", {"text": "green tea in the afternoon"})
    created = first.get(("u", "prefs"), "tea").created_at
    again = LanceDBStore(uri, index=index())
    assert again.get(("u", "prefs"), "tea").value == {"text": "green tea in the afternoon"}
    again.put(("u", "prefs"), "tea", {"text": "black tea"})
    assert again.get(("u", "prefs"), "tea").created_at == created
    assert again.search(("u",), query="black tea")[0].key == "tea"


def test_deleting_the_last_item_drops_the_namespace(tmp_path):
    store = LanceDBStore(str(tmp_path / "db"))
    store.put(("a", "x"), "k", {"v": 1})
    store.put(("a", "y"), "k", {"v": 2})
    store.delete(("a", "x"), "k")
    assert store.list_namespaces() == [("a", "y")]


def test_dims_mismatch_names_the_fix(tmp_path):
    uri = str(tmp_path / "db")
    LanceDBStore(uri, index=index(32)).put(("u",), "k", {"text": "x"})
    with pytest.raises(ConfigurationError, match="DUALMEM_STORE_URI"):
        LanceDBStore(uri, index=index(16))


def test_dual_view_shares_uri_and_embedder(tmp_path):
    store = LanceDBStore(str(tmp_path / "db"), index=index())
    store.dual.upsert([Fact(id="f1", namespace=("p", "u"), text="likes tea")])
    assert store.dual.count(("p", "u")) == 1
    # kv items and the dual memory do not mix: memory shows only under ("dualmem", ns…, kind)
    assert store.list_namespaces() == [("dualmem", "p", "u", "fact")]  # only namespaces that hold items
    assert store.list_namespaces(prefix=("p",)) == []


class State(TypedDict):
    text: str
    found: list[str]


def remember(state: State, runtime: Runtime) -> dict:
    runtime.store.put(("mem",), "last", {"text": state["text"]})
    return {}


def recall(state: State, runtime: Runtime) -> dict:
    return {"found": [i.value["text"] for i in runtime.store.search(("mem",), query=state["text"])]}


def test_compiled_graph_uses_the_store(tmp_path):
    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    store = LanceDBStore(str(tmp_path / "db"), index=index())
    graph = builder.compile(store=store)
    assert graph.invoke({"text": "walks the dog at dawn", "found": []})["found"] == ["walks the dog at dawn"]
    assert asyncio.run(graph.ainvoke({"text": "walks the dog at dawn", "found": []}))["found"]
    assert store.get(("mem",), "last").value["text"] == "walks the dog at dawn"


def test_make_store_reads_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALMEM_STORE_URI", str(tmp_path / "env-db"))
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:24")
    store = make_store()
    assert store.uri == str(tmp_path / "env-db") and store.kv.index_config["dims"] == 24
    store.put(("u",), "k", {"text": "hello"})
    assert store.search(("u",), query="hello")[0].score is not None


LOADER_SCRIPT = """
import asyncio, sys
from langgraph_api.store import _load_store, _yield_store
loaded = _load_store(sys.argv[1])

async def use():
    async with _yield_store(loaded) as store:
        await store.aput(("u",), "k", {"text": "served"})
        hits = await store.asearch(("u",), query="served")
        print(type(store).__module__, type(store).__name__, [i.key for i in hits])

asyncio.run(use())
"""


@pytest.mark.slow
def test_langgraph_server_loader_accepts_make_store(tmp_path):
    """Load the store the way `langgraph dev` does (file path from langgraph.json), in a clean process."""
    import langgraph_api  # noqa: F401 - installed with langgraph-cli[inmem] (dev extra); missing fails the test

    repo = Path(__file__).resolve().parents[1]
    spec = json.loads((repo / "langgraph.json").read_text())["store"]["path"]
    path, func = spec.rsplit(":", 1)
    env = {
        **os.environ,
        "DATABASE_URI": ":memory:",
        "REDIS_URI": "_FAKE",
        "LANGGRAPH_RUNTIME_EDITION": "inmem",
        "DUALMEM_STORE_URI": str(tmp_path / "server-db"),
        "DUALMEM_EMBEDDER": "hash:16",
    }
    done = subprocess.run(
        [sys.executable, "-c", LOADER_SCRIPT, f"{(repo / path).resolve()}:{func}"],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # built in the server's event loop: LangGraph's AsyncBatchedBaseStore over the LanceDBStore
    assert "dualmem.stores.batched BatchedStore ['k']" in done.stdout


async def test_gathered_async_calls_become_one_batch_and_keep_one_item_per_key(tmp_path):
    import asyncio
    import time

    from dualmem.stores.batched import BatchedStore

    store = BatchedStore(LanceDBStore(str(tmp_path / "db")))
    await store.aput(("warm",), "k", {"v": 0})
    started = time.perf_counter()
    puts = [store.aput(("users", f"u{i % 50}"), f"k{i}", {"v": i}) for i in range(500)]
    gets = [store.aget(("users", f"u{i % 50}"), f"k{i}") for i in range(500)]
    await asyncio.gather(*puts, *gets)
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(store.aput(("one",), "same", {"v": i}) for i in range(20)))  # one key, many puts at once
    assert len(await store.asearch(("users",), limit=1000)) == 500
    assert [i.value for i in await store.asearch(("one",))] == [{"v": 19}], "one key, one item: the last put wins"
    assert elapsed < 20, f"500 gathered puts and gets took {elapsed:.1f} s (one commit expected, not 500)"
