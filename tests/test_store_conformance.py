"""One behaviour for every LangGraph store view: LanceDBStore and DualMemStore over the in-memory stores must act
like LangGraph's own InMemoryStore."""

from __future__ import annotations

import pytest
from langgraph.store.base import GetOp, Item, ListNamespacesOp, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from dualmem.stores import DualMemStore, InMemoryDualStore
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.testing import HashEmbeddings

DIMS = 64


@pytest.fixture(params=["lancedb", "langgraph-inmemory", "dualmem-inmemory"])
def store(request, tmp_path):
    index = {"dims": DIMS, "embed": HashEmbeddings(DIMS), "fields": ["text"]}
    if request.param == "lancedb":
        return LanceDBStore(str(tmp_path / "db"), index=index)
    if request.param == "dualmem-inmemory":
        return DualMemStore(InMemoryStore(index=index), InMemoryDualStore(HashEmbeddings(DIMS)))
    return InMemoryStore(index=index)


@pytest.fixture
def plain_store(request, tmp_path):
    return LanceDBStore(str(tmp_path / "plain"))


DOCS = {
    "shifts": {"text": "works night shifts at a warehouse", "topic": "work", "n": 1, "tags": ["sleep"]},
    "games": {"text": "plays video games until three in the morning", "topic": "leisure", "n": 2},
    "cat": {"text": "adopted a grey cat named Pixel", "topic": "home", "n": 3, "meta": {"mood": "happy"}},
    "tea": {"text": "drinks green tea every afternoon", "topic": "home", "n": 4},
}


def fill(store, ns=("user", "memories")):
    for key, value in DOCS.items():
        store.put(ns, key, value)


def test_put_get_update_delete(store):
    ns = ("user", "profile")
    assert store.get(ns, "k") is None
    store.put(ns, "k", {"text": "likes tea", "n": 1})
    item = store.get(ns, "k")
    assert isinstance(item, Item) and item.value == {"text": "likes tea", "n": 1}
    assert item.namespace == ns and item.key == "k"
    store.put(ns, "k", {"text": "likes coffee", "n": 2})
    updated = store.get(ns, "k")
    assert updated.value["text"] == "likes coffee" and updated.updated_at >= item.updated_at
    store.delete(ns, "k")
    assert store.get(ns, "k") is None
    assert store.search(ns) == []


def test_namespace_isolation(store):
    store.put(("a", "b"), "k", {"text": "in a/b"})
    store.put(("a", "bc"), "k", {"text": "in a/bc"})
    store.put(("a",), "k", {"text": "in a"})
    assert store.get(("a", "b"), "k").value["text"] == "in a/b"
    assert {i.namespace for i in store.search(("a", "b"))} == {("a", "b")}
    assert {i.namespace for i in store.search(("a",))} == {("a",), ("a", "b"), ("a", "bc")}
    assert {i.namespace for i in store.search(("a", "b"), query="in")} == {("a", "b")}
    assert store.search(("z",)) == []


def test_search_without_query_lists_all_with_limit_offset(store):
    fill(store)
    everything = store.search(("user",), limit=10)
    assert {i.key for i in everything} == set(DOCS)
    assert all(i.score is None for i in everything)
    page = store.search(("user",), limit=2, offset=1)
    assert len(page) == 2 and {i.key for i in page} <= set(DOCS)


def test_filters(store):
    fill(store)
    assert {i.key for i in store.search(("user",), filter={"topic": "home"})} == {"cat", "tea"}
    assert {i.key for i in store.search(("user",), filter={"n": {"$gt": 2}})} == {"cat", "tea"}
    assert {i.key for i in store.search(("user",), filter={"n": {"$lte": 2, "$ne": 1}})} == {"games"}
    assert {i.key for i in store.search(("user",), filter={"meta": {"mood": "happy"}})} == {"cat"}
    assert {i.key for i in store.search(("user",), filter={"tags": ["sleep"]})} == {"shifts"}
    hits = store.search(("user",), query="grey cat", filter={"topic": "home"})
    assert [i.key for i in hits][0] == "cat" and {i.key for i in hits} == {"cat", "tea"}


def test_semantic_search_orders_by_score(store):
    fill(store)
    hits = store.search(("user",), query="adopted a grey cat named Pixel", limit=4)
    assert hits[0].key == "cat"
    scores = [h.score for h in hits]
    assert all(s is not None for s in scores) and scores == sorted(scores, reverse=True)
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.key for h in store.search(("user",), query="adopted a grey cat named Pixel", limit=2, offset=1)] == [
        h.key for h in hits[1:3]
    ]


def test_unindexed_items_come_last_without_score(store):
    fill(store)
    store.put(("user", "memories"), "secret", {"text": "grey cat named Pixel"}, index=False)
    hits = store.search(("user",), query="grey cat named Pixel", limit=10)
    assert hits[0].key == "cat" and hits[-1].key == "secret" and hits[-1].score is None


def test_index_fields_override_per_put(store):
    store.put(("docs",), "a", {"text": "alpha", "title": "grey cat named Pixel"}, index=["title"])
    store.put(("docs",), "b", {"text": "grey cat named Pixel", "title": "beta"})
    hits = store.search(("docs",), query="grey cat named Pixel")
    assert {h.key for h in hits} == {"a", "b"}
    assert hits[0].score == pytest.approx(hits[1].score, abs=1e-5)


def test_list_namespaces(store):
    for ns in [("a", "b", "c"), ("a", "b", "d"), ("a", "x"), ("z", "b", "c")]:
        store.put(ns, "k", {"text": "v"})
    assert store.list_namespaces() == [("a", "b", "c"), ("a", "b", "d"), ("a", "x"), ("z", "b", "c")]
    assert store.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d")]
    assert store.list_namespaces(suffix=("c",)) == [("a", "b", "c"), ("z", "b", "c")]
    assert store.list_namespaces(prefix=("*", "b")) == [("a", "b", "c"), ("a", "b", "d"), ("z", "b", "c")]
    assert store.list_namespaces(max_depth=2) == [("a", "b"), ("a", "x"), ("z", "b")]
    assert store.list_namespaces(limit=2, offset=1) == [("a", "b", "d"), ("a", "x")]


def test_batch_returns_results_in_op_order(store):
    store.put(("n",), "old", {"text": "before the batch"})
    results = store.batch(
        [
            GetOp(("n",), "old"),
            PutOp(("n",), "new", {"text": "written in the batch"}),
            SearchOp(("n",), filter=None, limit=10, offset=0, query=None),
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
            GetOp(("n",), "missing"),
        ]
    )
    assert len(results) == 5
    assert results[0].value == {"text": "before the batch"}
    assert results[1] is None
    assert [i.key for i in results[2]] == ["old"]  # reads see the state before the batch's writes
    assert results[3] == [("n",)]
    assert results[4] is None
    assert store.get(("n",), "new").value == {"text": "written in the batch"}


async def test_async_api(store):
    await store.aput(("u",), "k", {"text": "grey cat named Pixel"})
    await store.aput(("u",), "j", {"text": "green tea"})
    assert (await store.aget(("u",), "k")).value["text"] == "grey cat named Pixel"
    hits = await store.asearch(("u",), query="grey cat")
    assert hits[0].key == "k"
    assert await store.alist_namespaces() == [("u",)]
    await store.adelete(("u",), "k")
    assert await store.aget(("u",), "k") is None


def test_without_index_search_has_no_scores(plain_store):
    plain_store.put(("u",), "k", {"text": "grey cat"})
    hits = plain_store.search(("u",), query="grey cat")
    assert [h.key for h in hits] == ["k"] and hits[0].score is None


@pytest.mark.parametrize(
    ("label", "decoy"),
    [
        ("user_1", "userX1"),
        ("a%b", "axxb"),
        ("star*", "starX"),
        ("q?m", "qXm"),
        ("br[ack]et", "brXacXket"),
        ("foo", "foobar"),
    ],
)
def test_prefixes_match_labels_literally_and_whole(store, label, decoy):
    """SQL LIKE/GLOB characters in a label are plain characters, and a prefix never matches part of a label."""
    for ns in [(label,), (label, "child"), (decoy,), (decoy, "child")]:
        store.put(ns, "k", {"text": "v"})
    assert {i.namespace for i in store.search((label,), limit=100)} == {(label,), (label, "child")}
    assert set(store.list_namespaces(prefix=(label,), limit=100)) == {(label,), (label, "child")}
    assert set(store.list_namespaces(prefix=(label, "child"), limit=100)) == {(label, "child")}


def test_labels_differ_by_case_and_trailing_newline_and_an_empty_prefix_matches_all(store):
    for ns in [("Foo",), ("foo",), ("users", "alice"), ("users", "alice\n"), ("uid", "users", "malice")]:
        store.put(ns, "k", {"text": "v"})
    assert {i.namespace for i in store.search(("foo",), limit=100)} == {("foo",)}
    assert {i.namespace for i in store.search(("Foo",), limit=100)} == {("Foo",)}
    assert store.list_namespaces(suffix=("alice",), limit=100) == [("users", "alice")]
    assert store.list_namespaces(prefix=("users", "alice"), limit=100) == [("users", "alice")]
    assert len(store.search((), limit=100)) == 5


def test_filter_keys_and_values_are_literals_that_never_widen_a_search(store):
    ns = ("docs",)
    store.put(ns, "pub", {"access": "public", "title": "O'Brien's notes", "access-level": "1", "123abc": "ok"})
    store.put(ns, "secret", {"access": "secret", "a') OR ('1'='1": "odd key"})
    for value in [
        "public' OR '1'='1",
        "public'; --",
        "public' UNION SELECT * FROM store --",
        "''''",
        "public\x00' OR '1'='1",
    ]:
        assert store.search(ns, filter={"access": value}) == []
    assert [i.key for i in store.search(ns, filter={"title": "O'Brien's notes"})] == ["pub"]
    assert [i.key for i in store.search(ns, filter={"access-level": "1"})] == ["pub"]
    assert [i.key for i in store.search(ns, filter={"123abc": "ok"})] == ["pub"]
    # SQLite's store refuses such a key; here (as InMemory and Postgres) it is a plain key, matched literally
    assert store.search(ns, filter={"access') = 'public' OR '1'='1": "dummy"}) == []
    assert [i.key for i in store.search(ns, filter={"a') OR ('1'='1": "odd key"})] == ["secret"]


def test_numeric_and_boolean_filters_with_extreme_values(store):
    ns = ("items",)
    for key, price, active in [("a", 10, True), ("b", 20, False), ("c", 30, True), ("neg", -10, False)]:
        store.put(ns, key, {"price": price, "active": active})
    assert len(store.search(ns, filter={"price": {"$lt": float("inf")}})) == 4
    assert len(store.search(ns, filter={"price": {"$gt": float("-inf")}})) == 4
    assert len(store.search(ns, filter={"price": {"$lt": 10**100}})) == 4
    assert store.search(ns, filter={"price": {"$eq": float("nan")}}) == []
    assert [i.key for i in store.search(ns, filter={"price": {"$lt": 0}})] == ["neg"]
    assert {i.key for i in store.search(ns, filter={"active": True})} == {"a", "c"}
    assert {i.key for i in store.search(ns, filter={"active": False})} == {"b", "neg"}


async def test_sync_methods_also_work_on_a_thread_running_an_event_loop(store):
    """LangGraph's async SQLite/Postgres stores raise InvalidStateError here; LanceDBStore (as InMemoryStore) serves them."""
    store.put(("loop",), "k", {"text": "v"})
    assert store.get(("loop",), "k").value == {"text": "v"}
    assert [i.key for i in store.search(("loop",))] == ["k"]
    assert store.list_namespaces(prefix=("loop",)) == [("loop",)]
    store.delete(("loop",), "k")
    assert await store.aget(("loop",), "k") is None
