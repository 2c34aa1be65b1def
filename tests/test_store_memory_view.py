"""The dual memory through the LangGraph store API: ("dualmem", persona, user, kind) namespaces, on both stores."""

from __future__ import annotations

import pytest
from langgraph.store.memory import InMemoryStore

from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import DualMemStore, InMemoryDualStore
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.testing import HashEmbeddings


@pytest.fixture(params=["lancedb", "memory"])
def kind(request):
    return request.param


def _store(tmp_path, kind="lancedb"):
    emb = HashEmbeddings(32)
    index = {"dims": 32, "embed": emb, "fields": ["$"]}
    if kind == "memory":
        store = DualMemStore(InMemoryStore(index=index), InMemoryDualStore(emb))
    else:
        store = LanceDBStore(str(tmp_path / "db"), index=index)
    ns = ("mia", "user")
    store.dual.upsert(
        [
            Fact(id="f1", namespace=ns, text="works night shifts at a warehouse", source=SourceRef(session_id="s1")),
            Fact(id="f2", namespace=ns, text="plays video games until 3 am"),
            Insight(id="i1", namespace=ns, text="gaming is decompression after night work", grounding=["f1", "f2"]),
            Fact(id="o1", namespace=("other", "user"), text="works night shifts at a hospital"),
        ]
    )
    return store


def test_get_search_and_list_memory_through_the_store_api(tmp_path, kind):
    store = _store(tmp_path, kind)
    item = store.get(("dualmem", "mia", "user", "fact"), "f1")
    assert (
        item is not None and item.value["text"].startswith("works night") and item.value["source"]["session_id"] == "s1"
    )
    assert store.get(("dualmem", "mia", "user", "insight"), "f1") is None, "kind is part of the namespace"
    hits = store.search(("dualmem", "mia", "user", "fact"), query="night shifts warehouse", limit=5)
    assert [h.key for h in hits][0] == "f1" and {h.key for h in hits} <= {"f1", "f2"}, "namespace isolation"
    both = store.search(("dualmem", "mia", "user"), query="night shifts", limit=10)
    assert {h.key for h in both} == {"f1", "f2", "i1"}
    insight = store.search(("dualmem", "mia", "user", "insight"))[0]
    assert insight.value["grounding"] == ["f1", "f2"]
    assert ("dualmem", "mia", "user", "fact") in store.list_namespaces(prefix=("dualmem",))


def test_put_and_delete_memory_through_the_store_api(tmp_path, kind):
    store = _store(tmp_path, kind)
    store.put(("dualmem", "mia", "user", "fact"), "f2", {"text": "stopped gaming at night"})
    assert store.dual.get(("mia", "user"), ["f2"])[0].text == "stopped gaming at night"
    store.put(("dualmem", "mia", "user", "fact"), "f3", {"text": "adopted a dog"})
    assert store.get(("dualmem", "mia", "user", "fact"), "f3").value["kind"] == "fact"
    store.delete(("dualmem", "mia", "user", "fact"), "f3")
    assert store.get(("dualmem", "mia", "user", "fact"), "f3") is None
    # plain values are untouched by the memory view
    store.put(("notes", "mia"), "k", {"text": "likes tea"})
    assert store.get(("notes", "mia"), "k").value == {"text": "likes tea"}


def test_a_filtered_query_search_fills_its_page_however_rare_the_matches(tmp_path, kind):
    """Only the 5 facts least like the query match the filter, behind 400 closer ones: the page still holds all 5."""
    store = _store(tmp_path, kind)
    ns = ("rare", "user")
    near = [
        Fact(id=f"n{i}", namespace=ns, text=f"night shifts at the warehouse, week {i}", event_time="2024-01-01")
        for i in range(400)
    ]
    far = [
        Fact(id=f"r{i}", namespace=ns, text=f"collects stamps from Peru {i}", event_time="2023-05-0" + str(i + 1))
        for i in range(5)
    ]
    store.dual.upsert(near + far)
    hits = store.search(
        ("dualmem", "rare", "user", "fact"),
        query="night shifts warehouse",
        filter={"event_time": {"$lt": "2024"}},
        limit=5,
    )
    assert sorted(h.key for h in hits) == [f"r{i}" for i in range(5)]
    page = store.search(
        ("dualmem", "rare", "user", "fact"),
        query="night shifts",
        filter={"event_time": {"$lt": "2024"}},
        limit=2,
        offset=3,
    )
    assert len(page) == 2 and {h.key for h in page} <= {f"r{i}" for i in range(5)}
