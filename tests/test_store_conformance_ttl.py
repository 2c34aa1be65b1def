"""LanceDBStore behaviours of LangGraph's SQLite and Postgres store tests beyond InMemoryStore: TTL, sweeping,
omit_expired, default TTL from the store config, dotted filter paths, ``text_fields``, distance types — and the
dual memory's own rule (facts and insights do not expire)."""

from __future__ import annotations

import math
import time
import warnings

import pytest

from dualmem.stores import memory_view
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.testing import HashEmbeddings

DIMS = 64
SHORT = 0.5 / 60  # half a second, in minutes


def _store(tmp_path, **kwargs):
    return LanceDBStore(str(tmp_path / "db"), **kwargs)


def test_expired_items_are_swept_and_unexpired_ones_stay(tmp_path):
    store = _store(tmp_path)
    store.put(("s",), "short", {"v": 1}, ttl=SHORT)
    store.put(("s",), "long", {"v": 2}, ttl=60)
    store.put(("s",), "forever", {"v": 3})
    time.sleep(0.8)
    assert store.sweep_ttl() == 1
    assert store.get(("s",), "short") is None
    assert {i.key for i in store.search(("s",))} == {"long", "forever"}


def test_a_sweep_keeps_an_item_put_again_after_it_looked_for_expired_ones(tmp_path, monkeypatch):
    """Another worker re-puts an expired item between the sweeper's scan and its delete: the item and its vectors stay."""
    import dualmem.stores.kv as kv

    index = {"dims": DIMS, "embed": HashEmbeddings(DIMS), "fields": ["text"]}
    store = _store(tmp_path, index=index)
    other = _store(tmp_path, index=index)  # a second handle on the same tables, as another worker holds
    store.put(("s",), "raced", {"text": "night shifts"}, ttl=SHORT)
    store.put(("s",), "expired", {"text": "old plan"}, ttl=SHORT)
    time.sleep(0.8)
    scan = kv.L.query_rows

    def scan_then_race(table, where, cols, *args, **kwargs):
        rows = scan(table, where, cols, *args, **kwargs)
        if where and "expires_at <=" in where and not getattr(scan_then_race, "done", False):
            scan_then_race.done = True  # type: ignore[attr-defined]
            other.put(("s",), "raced", {"text": "night shifts, again"})  # refreshed by a put with no TTL
        return rows

    monkeypatch.setattr(kv.L, "query_rows", scan_then_race)
    assert store.sweep_ttl() == 1
    monkeypatch.setattr(kv.L, "query_rows", scan)
    assert store.get(("s",), "expired") is None
    assert store.get(("s",), "raced").value == {"text": "night shifts, again"}
    assert [i.key for i in store.search(("s",), query="night shifts")][:1] == ["raced"]  # its vectors stayed


def test_a_read_with_refresh_extends_the_expiry_and_one_without_does_not(tmp_path):
    store = _store(tmp_path)
    store.put(("s",), "read", {"v": 1}, ttl=SHORT * 2)  # one second
    store.put(("s",), "unread", {"v": 2}, ttl=SHORT * 2)
    time.sleep(0.6)
    assert store.get(("s",), "read", refresh_ttl=True) is not None
    assert store.get(("s",), "unread", refresh_ttl=False) is not None
    time.sleep(0.6)  # 1.2 s after the put: "unread" expired, "read" was refreshed 0.6 s ago
    assert store.sweep_ttl() == 1
    assert store.get(("s",), "read") is not None and store.get(("s",), "unread") is None


def test_omit_expired_hides_expired_items_before_any_sweep(tmp_path):
    store = _store(tmp_path, ttl={"omit_expired": True})
    store.put(("s",), "gone", {"v": 1}, ttl=SHORT)
    store.put(("s",), "kept", {"v": 2})
    time.sleep(0.8)
    assert store.get(("s",), "gone") is None
    assert [i.key for i in store.search(("s",))] == ["kept"]
    plain = _store(tmp_path)  # without omit_expired an expired item stays visible until swept (as Postgres)
    assert plain.get(("s",), "gone") is not None


def test_default_ttl_of_the_store_config_applies_to_puts_without_one(tmp_path):
    store = _store(tmp_path, ttl={"default_ttl": SHORT})
    store.put(("s",), "defaulted", {"v": 1})
    store.put(("s",), "explicit", {"v": 2}, ttl=60)
    time.sleep(0.8)
    assert store.sweep_ttl() == 1
    assert store.get(("s",), "defaulted") is None and store.get(("s",), "explicit") is not None


def test_a_negative_ttl_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ttl"):
        _store(tmp_path).put(("s",), "k", {"v": 1}, ttl=-1)


def test_filters_follow_dotted_paths_and_operators(tmp_path):
    store = _store(tmp_path)
    store.put(("u",), "a", {"meta": {"mood": "happy", "n": 3}, "tags": ["x"]})
    store.put(("u",), "b", {"meta": {"mood": "sad", "n": 1}})
    store.put(("u",), "c", {"other": 1})
    assert [i.key for i in store.search(("u",), filter={"meta.mood": "happy"})] == ["a"]
    assert [i.key for i in store.search(("u",), filter={"meta.n": {"$gt": 2}})] == ["a"]
    assert sorted(i.key for i in store.search(("u",), filter={"meta.mood": {"$ne": "happy"}})) == ["b", "c"]


def test_text_fields_is_an_alias_of_fields(tmp_path):
    store = _store(tmp_path, index={"dims": DIMS, "embed": HashEmbeddings(DIMS), "text_fields": ["title"]})
    store.put(("d",), "a", {"title": "green tea every afternoon", "body": "night shifts at a warehouse"})
    store.put(("d",), "b", {"title": "night shifts at a warehouse", "body": "green tea every afternoon"})
    hits = store.search(("d",), query="green tea every afternoon")
    assert hits[0].key == "a" and hits[0].score > hits[1].score  # only the title was embedded


@pytest.mark.parametrize("distance", ["cosine", "inner_product", "l2"])
def test_distance_types_score_as_langgraphs_postgres_store(tmp_path, distance):
    emb = HashEmbeddings(DIMS)
    store = _store(tmp_path, index={"dims": DIMS, "embed": emb, "fields": ["text"], "distance_type": distance})
    texts = {"a": "works night shifts", "b": "drinks green tea", "c": "adopted a grey cat"}
    for key, text in texts.items():
        store.put(("d",), key, {"text": text})
    q = emb.embed_query("drinks green tea")
    expected = {}
    for key, text in texts.items():
        v = emb.embed_documents([text])[0]
        dot = sum(x * y for x, y in zip(q, v, strict=True))
        if distance == "cosine":
            expected[key] = dot / (math.sqrt(sum(x * x for x in q)) * math.sqrt(sum(y * y for y in v)))
        elif distance == "inner_product":
            expected[key] = dot  # Postgres: -(negative inner product)
        else:
            expected[key] = -math.sqrt(sum((x - y) ** 2 for x, y in zip(q, v, strict=True)))  # Postgres: -distance
    hits = store.search(("d",), query="drinks green tea")
    assert [h.key for h in hits] == sorted(expected, key=expected.get, reverse=True)
    for h in hits:
        assert h.score == pytest.approx(expected[h.key], abs=1e-4)


def test_unknown_distance_type_is_refused(tmp_path):
    with pytest.raises(ValueError, match="distance_type"):
        _store(tmp_path, index={"dims": DIMS, "embed": HashEmbeddings(DIMS), "distance_type": "manhattan"})


def test_facts_do_not_expire_and_a_ttl_on_them_warns(tmp_path, monkeypatch):
    from dualmem.stores import LanceDualStore

    monkeypatch.setattr(memory_view, "_WARNED", set())
    uri = str(tmp_path / "db")
    store = LanceDBStore(uri, dual=LanceDualStore(uri, HashEmbeddings(DIMS)))
    ns = ("dualmem", "mara", "alice", "fact")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.put(ns, "f1", {"text": "Alice works nights"}, ttl=SHORT)
        store.put(ns, "f2", {"text": "Alice likes tea"}, ttl=SHORT)
    assert [str(w.message) for w in caught if "TTL does not apply" in str(w.message)] != []
    assert sum("TTL does not apply" in str(w.message) for w in caught) == 1  # once per process
    time.sleep(0.8)
    store.sweep_ttl()
    assert store.get(ns, "f1").value["text"] == "Alice works nights"


def test_omit_expired_filters_before_paging(tmp_path):
    """An expired item inside the first page's window does not leave that page short (Postgres store semantics)."""
    store = _store(tmp_path, ttl={"omit_expired": True})
    for key in ("c", "b"):
        store.put(("page",), key, {"k": key})
    store.put(("page",), "expired", {"k": "x"}, ttl=SHORT)
    store.put(("page",), "a", {"k": "a"})  # newest first: a, expired, b, c
    time.sleep(0.8)
    assert [i.key for i in store.search(("page",), limit=2)] == ["a", "b"]
    assert [i.key for i in store.search(("page",), limit=2, offset=2)] == ["c"]


def test_a_refreshing_read_never_brings_an_expired_item_back(tmp_path):
    from dualmem.stores.kv import item_id

    store = _store(tmp_path, ttl={"omit_expired": True})
    ns = ("refresh",)
    store.put(ns, "expired", {"n": 0}, ttl=SHORT)
    store.put(ns, "live", {"n": 1}, ttl=1)
    time.sleep(0.8)

    def expires(key):
        from dualmem.stores._lance import query_rows

        return query_rows(store.kv.items, f"id = '{item_id(ns, key)}'", ["expires_at"])[0]["expires_at"]

    expired_before, live_before = expires("expired"), expires("live")
    assert store.get(ns, "expired", refresh_ttl=True) is None
    assert [i.key for i in store.search(ns, refresh_ttl=True)] == ["live"]
    assert expires("expired") == expired_before
    assert expires("live") > live_before


def test_the_background_sweeper_deletes_expired_items_until_stopped(tmp_path):
    store = _store(tmp_path, ttl={"sweep_interval_minutes": SHORT / 2})
    store.put(("s",), "gone", {"v": 1}, ttl=SHORT)
    store.put(("s",), "kept", {"v": 2})
    sweeper = store.start_ttl_sweeper()
    assert store.start_ttl_sweeper() is sweeper and not sweeper.done()
    time.sleep(1.5)
    assert store.get(("s",), "gone") is None and store.get(("s",), "kept") is not None
    assert store.stop_ttl_sweeper(timeout=10) and sweeper.done()
    assert store.stop_ttl_sweeper()  # nothing left to stop


async def test_the_sweeper_calls_can_be_awaited_as_on_langgraphs_async_postgres_store(tmp_path):
    store = _store(tmp_path, ttl={"sweep_interval_minutes": SHORT / 2})
    sweeper = await store.start_ttl_sweeper()  # returns at once, the sweeper keeps running
    assert not sweeper.done()
    assert await store.stop_ttl_sweeper(timeout=10) is True
    assert sweeper.done()
    assert (await _store(tmp_path).start_ttl_sweeper()).done()  # no TTL config: nothing to sweep
