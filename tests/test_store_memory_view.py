"""The dual memory through the LangGraph store API: ("dualmem", persona, user, kind) namespaces."""

from __future__ import annotations

from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.testing import HashEmbeddings


def _store(tmp_path):
    emb = HashEmbeddings(32)
    store = LanceDBStore(str(tmp_path / "db"), index={"dims": 32, "embed": emb, "fields": ["$"]})
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


def test_get_search_and_list_memory_through_the_store_api(tmp_path):
    store = _store(tmp_path)
    item = store.get(("dualmem", "mia", "user", "fact"), "f1")
    assert item is not None and item.value["text"].startswith("works night") and item.value["source"]["session_id"] == "s1"
    assert store.get(("dualmem", "mia", "user", "insight"), "f1") is None, "kind is part of the namespace"
    hits = store.search(("dualmem", "mia", "user", "fact"), query="night shifts warehouse", limit=5)
    assert [h.key for h in hits][0] == "f1" and {h.key for h in hits} <= {"f1", "f2"}, "namespace isolation"
    both = store.search(("dualmem", "mia", "user"), query="night shifts", limit=10)
    assert {h.key for h in both} == {"f1", "f2", "i1"}
    insight = store.search(("dualmem", "mia", "user", "insight"))[0]
    assert insight.value["grounding"] == ["f1", "f2"]
    assert ("dualmem", "mia", "user", "fact") in store.list_namespaces(prefix=("dualmem",))


def test_put_and_delete_memory_through_the_store_api(tmp_path):
    store = _store(tmp_path)
    store.put(("dualmem", "mia", "user", "fact"), "f2", {"text": "stopped gaming at night"})
    assert store.dual.get(("mia", "user"), ["f2"])[0].text == "stopped gaming at night"
    store.put(("dualmem", "mia", "user", "fact"), "f3", {"text": "adopted a dog"})
    assert store.get(("dualmem", "mia", "user", "fact"), "f3").value["kind"] == "fact"
    store.delete(("dualmem", "mia", "user", "fact"), "f3")
    assert store.get(("dualmem", "mia", "user", "fact"), "f3") is None
    # plain values are untouched by the memory view
    store.put(("notes", "mia"), "k", {"text": "likes tea"})
    assert store.get(("notes", "mia"), "k").value == {"text": "likes tea"}
