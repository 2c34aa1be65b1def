"""The DualStore contract, one test body over both backends: a real LanceDB folder and the in-memory store."""

from __future__ import annotations

import time

import pytest

from dualmem.errors import ConfigurationError
from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import InMemoryDualStore, LanceDualStore, open_store
from dualmem.testing import HashEmbeddings

NS = ("psychologist", "user")


@pytest.fixture(params=["lancedb", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        return InMemoryDualStore(HashEmbeddings(64))
    return LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))


def fact(fid, text, ns=NS, **kw):
    return Fact(id=fid, namespace=ns, text=text, **kw)


def insight(iid, text, grounding, ns=NS, **kw):
    return Insight(id=iid, namespace=ns, text=text, grounding=grounding, **kw)


@pytest.fixture
def filled(store):
    store.upsert(
        [
            fact(
                "f1",
                "works night shifts at a warehouse",
                event_time="2024-01-05",
                source=SourceRef(session_id="s1", turn_ids=["s1:3"], chunk_id="c1"),
            ),
            fact("f2", "plays video games until three in the morning", event_time="2024-02-10"),
            fact("f3", "adopted a grey cat named Pixel", event_time="2024-03-15"),
            insight(
                "i1",
                "the late gaming reads as behavioural fatigue after night shifts, not laziness",
                ["f1", "f2"],
                emotion=[0.0, 0.1, 0.0, 0.0, 0.6, 0.0, 0.0, 0.3],
            ),
            insight("i2", "caring for the cat gives structure and comfort", ["f3"]),
        ]
    )
    return store


def test_roundtrip_keeps_every_field(filled):
    [f1, i1] = filled.get(NS, ["f1", "i1"])
    assert f1.kind == "fact" and f1.namespace == NS
    assert f1.source.session_id == "s1" and f1.source.turn_ids == ["s1:3"] and f1.source.chunk_id == "c1"
    assert f1.event_time == "2024-01-05"
    assert i1.kind == "insight" and i1.grounding == ["f1", "f2"]
    assert i1.emotion == pytest.approx([0.0, 0.1, 0.0, 0.0, 0.6, 0.0, 0.0, 0.3])
    assert i1.created_at.tzinfo is not None


def test_get_keeps_order_and_skips_missing(filled):
    assert [m.id for m in filled.get(NS, ["i2", "nope", "f3", "f1"])] == ["i2", "f3", "f1"]
    assert filled.get(NS, []) == []


def test_upsert_is_idempotent_writes_items_as_given_and_stamps_the_write(filled):
    before = {m.id: m for m in filled.list(NS)}
    v0 = filled.version()
    time.sleep(0.01)
    kept = before["f1"].created_at
    filled.upsert(
        [
            fact("f1", "works night shifts", created_at=kept),
            fact("f1", "works night shifts at a warehouse", created_at=kept),
        ]
    )
    filled.upsert([fact("f1", "works night shifts at a warehouse", created_at=kept)])
    assert filled.count(NS) == 5 and filled.count(NS, kind="fact") == 3  # one row per key; the last of a batch wins
    after = filled.get(NS, ["f1"])[0]
    assert after.text == "works night shifts at a warehouse" and after.created_at == kept
    assert after.updated_at > before["f1"].updated_at  # updated_at is the store's write time
    assert filled.version() != v0


def test_upsert_new_text_is_reembedded(filled):
    filled.upsert([fact("f3", "bought a red bicycle for commuting")])
    top = filled.search(NS, "red bicycle", kind="fact", k=1, mode="vector")
    assert top[0].item.id == "f3" and top[0].item.text.startswith("bought")


def test_changing_kind_moves_the_item(filled):
    filled.upsert([insight("f3", "the cat is a coping strategy", ["f1"])])
    assert filled.count(NS, kind="fact") == 2 and filled.count(NS, kind="insight") == 3
    assert filled.get(NS, ["f3"])[0].kind == "insight"


@pytest.mark.parametrize("mode", ["vector", "fts", "hybrid"])
def test_search_modes_rank_the_matching_item_first(filled, mode):
    hits = filled.search(NS, "grey cat named Pixel", k=3, mode=mode)
    assert hits and hits[0].item.id == "f3"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_hybrid_fuses_both_rankings(filled):
    hits = filled.search(NS, "night shifts warehouse", k=5, mode="hybrid")
    assert hits[0].item.id == "f1"
    assert hits[0].score == pytest.approx(2 / 61)  # first in both rankings


def test_fts_finds_items_written_after_maintenance(store):
    store.upsert([fact("a", "likes hiking in the alps")])
    assert [h.item.id for h in store.search(NS, "hiking", mode="fts")] == ["a"]
    store.maintain()
    store.upsert([fact("b", "collects vintage typewriters")])
    assert [h.item.id for h in store.search(NS, "typewriters", mode="fts")] == ["b"]
    store.upsert([fact("a", "likes sailing on lakes")])
    assert store.search(NS, "hiking", mode="fts") == []
    assert [h.item.id for h in store.search(NS, "sailing", mode="fts")] == ["a"]


def test_supersede_hides_from_search_and_list(filled):
    filled.supersede(NS, ["f3"])
    assert "f3" not in {h.item.id for h in filled.search(NS, "grey cat Pixel", mode="hybrid")}
    assert "f3" not in {m.id for m in filled.list(NS)}
    assert filled.get(NS, ["f3"])[0].status == "superseded"
    assert {m.id for m in filled.list(NS, status="superseded")} == {"f3"}
    assert len(filled.list(NS, status=None)) == 5
    assert filled.count(NS, kind="fact") == 2


def test_delete_removes_for_good(filled):
    filled.delete(NS, ["f2", "i2"])
    assert filled.get(NS, ["f2", "i2"]) == []
    assert filled.count(NS, status=None) == 3


def test_prefilters_namespace_kind_where_and_time(filled):
    other = ("psychologist", "someone else")
    filled.upsert([fact("o1", "works night shifts at a warehouse", ns=other)])
    assert {h.item.id for h in filled.search(NS, "night shifts warehouse", k=10, mode="fts")} == {"f1", "i1"}
    assert [h.item.id for h in filled.search(other, "night shifts", mode="hybrid")] == ["o1"]
    assert {h.item.kind for h in filled.search(NS, "night shifts cat", kind="insight")} == {"insight"}
    assert {h.item.id for h in filled.search(NS, "cat", filter={"session_id": "s1"}, mode="vector")} == {"f1"}
    ids = {
        h.item.id
        for h in filled.search(
            NS, "games shifts cat", kind="fact", mode="vector", since="2024-02-01", until="2024-03-01"
        )
    }
    assert ids == {"f2"}


def test_namespace_with_a_quote_is_escaped(store):
    odd = ("O'Brien", "user's")
    store.upsert([fact("q1", "drinks tea at five", ns=odd), fact("q2", "drinks tea at five")])
    assert [h.item.id for h in store.search(odd, "tea", mode="hybrid")] == ["q1"]
    assert store.count(odd) == 1 and store.namespaces(("O'Brien",)) == [odd]
    store.drop_namespace(odd)
    assert store.count(odd) == 0 and store.count(NS) == 1


def test_list_orders_and_limits(store):
    for i in range(4):
        store.upsert([fact(f"n{i}", f"note number {i}")])
        time.sleep(0.002)
    assert [m.id for m in store.list(NS)] == ["n3", "n2", "n1", "n0"]
    assert [m.id for m in store.list(NS, newest_first=False, limit=2)] == ["n0", "n1"]


def test_search_by_kind_and_grounding_give_insights_with_their_cited_facts(filled):
    facts = filled.search(NS, "night shifts and gaming fatigue", kind="fact", k=2)
    insights = filled.search(NS, "night shifts and gaming fatigue", kind="insight", k=2)
    assert len(facts) == 2 and len(insights) == 2
    assert {h.item.kind for h in facts} == {"fact"} and {h.item.kind for h in insights} == {"insight"}
    grounding = filled.grounding(NS, [h.item for h in insights])
    assert [f.id for f in grounding["i1"]] == ["f1", "f2"]
    assert [f.id for f in grounding["i2"]] == ["f3"]


def test_namespaces_with_prefix(filled):
    filled.upsert([fact("x", "a", ns=("psychologist",)), fact("y", "b", ns=("psychologistic", "u"))])
    assert filled.namespaces() == [("psychologist",), ("psychologist", "user"), ("psychologistic", "u")]
    assert filled.namespaces(("psychologist",)) == [("psychologist",), ("psychologist", "user")]


def test_chunk_ledger(filled):
    assert not filled.chunk_applied(NS, "c1")
    filled.ledger.mark(NS, "c1", "pending", '{"plan": 1}')
    assert not filled.chunk_applied(NS, "c1") and filled.ledger.look(NS, "c2") == (None, [("c1", '{"plan": 1}')])
    filled.ledger.mark(NS, "c1", "applied", '{"facts": []}')
    filled.ledger.mark(NS, "c1", "applied", '{"facts": []}')
    assert filled.chunk_applied(NS, "c1") and not filled.chunk_applied(("other",), "c1")
    assert filled.ledger.look(NS, "c1") == (("applied", '{"facts": []}'), [])
    assert filled.ledger.applied_ids(NS) == {"c1"}
    filled.ledger.mark(NS, "c3", "pending", "p3")
    filled.ledger.mark(NS, "c2", "pending", "p2")  # drafted later: pending units come oldest first
    filled.ledger.mark(("other",), "c4", "pending", "p4")
    assert filled.ledger.units(NS) == ({"c1"}, [("c3", "p3"), ("c2", "p2")])  # one read: what applied_ids and look say
    filled.drop_namespace(NS)
    assert not filled.chunk_applied(NS, "c1") and filled.count(NS, status=None) == 0


def test_scan_returns_one_row_per_item_sorted_by_key_with_stamps_or_vectors(filled):
    rows = filled.scan(NS, columns="vectors")
    assert (
        rows.column("id").to_pylist() == ["f1", "f2", "f3", "i1", "i2"] and rows.column("vector").type.list_size == 64
    )
    stamps = filled.scan(NS, kind="insight", columns="stamps")
    assert stamps.column_names == ["pk", "id", "updated_at", "row"] and stamps.column("row").type == "uint64"
    assert filled.scan(NS, ids=["f2", "nope"]).column("id").to_pylist() == ["f2"]


def test_rows_read_where_a_stamps_scan_saw_them_are_the_rows_a_read_by_id_gives(filled):
    """``at`` may only make a read faster: rows changed, deleted, compacted away or of another kind since the stamps
    scan come back exactly as a read by id gives them."""
    ids = ["f1", "f2", "f3", "i1", "i2"]
    at = filled.scan(NS, columns="stamps").column("row").to_pylist()

    def same(at: list) -> None:
        for kind, status in ((None, "active"), ("fact", "active"), ("insight", "active"), (None, None)):
            by_id = filled.scan(NS, kind=kind, status=status, columns="vectors", ids=ids)
            assert filled.scan(NS, kind=kind, status=status, columns="vectors", ids=ids, at=at) == by_id

    same(at)
    filled.upsert([fact("f1", "works day shifts now")])  # f1's row moves
    filled.delete(NS, ["f2"])
    filled.supersede(NS, ["i2"])
    same(at)
    same(filled.scan(NS, status=None, columns="stamps").column("row").to_pylist())  # the superseded i2's row too
    assert filled.scan(NS, columns="vectors", ids=ids, at=at).column("id").to_pylist() == ["f1", "f3", "i1"]
    if isinstance(filled, LanceDualStore):
        filled.tidy()  # fragments rewritten: every address from before names no current row
    same(at)
    assert filled.get(NS, ["f1"])[0].text == "works day shifts now"
    other = ("someone-else", "user")
    filled.upsert([fact("f1", "another namespace's f1", ns=other)])
    theirs = filled.scan(other, columns="stamps").column("row").to_pylist()
    assert filled.scan(NS, ids=["f1"], at=theirs).column("text").to_pylist() == ["works day shifts now"]
    for bad in ([-1], ["x"], [1.5]):
        with pytest.raises(ValueError, match="row` values of a stamps scan"):
            filled.scan(NS, ids=["f1"], at=bad)


def test_lancedb_reopening_sees_the_data_and_checks_dims(tmp_path):
    uri = str(tmp_path / "db")
    LanceDualStore(uri, HashEmbeddings(32)).upsert([fact("a", "likes tea")])
    assert LanceDualStore(uri, HashEmbeddings(32)).get(NS, ["a"])[0].text == "likes tea"
    with pytest.raises(ConfigurationError, match="DUALMEM_EMBEDDER"):
        LanceDualStore(uri, HashEmbeddings(16))


def test_opening_a_store_on_object_storage_lists_and_reads_each_table_once(s3_server):
    """Every process that opens a store pays this: a server worker, a CLI command, each ingest or eval worker."""
    uri = f"s3://{s3_server['bucket']}/open-{time.time_ns()}"
    LanceDualStore(uri, HashEmbeddings(32), storage_options=s3_server["options"]).upsert([fact("a", "likes tea")])
    before = len(s3_server["requests"]())
    store = LanceDualStore(uri, HashEmbeddings(32), storage_options=s3_server["options"])
    requests = len(s3_server["requests"]()) - before
    assert requests <= 30  # 54 when each table was found by listing and its schema read once per column
    assert store.get(NS, ["a"])[0].text == "likes tea"


def test_open_store_uses_store_uri(tmp_settings):
    store = open_store(tmp_settings)
    store.upsert([fact("a", "likes tea")])
    assert LanceDualStore(tmp_settings.store_uri, HashEmbeddings(64)).count(NS) == 1


def test_namespaces_that_join_to_the_same_string_stay_apart(store):
    """("a", "b\\x1fc") and ("a\\x1fb", "c") — and ("a", "b/c") vs ("a/b", "c") — are different namespaces."""
    pairs = [(("a", "b\x1fc"), ("a\x1fb", "c")), (("a", "b/c"), ("a/b", "c")), (("a", 'b","c'), ("a", "b", "c"))]
    for left, right in pairs:
        store.upsert([fact("same-id", "drinks tea at five", ns=left)])
        store.upsert([fact("same-id", "drinks coffee at six", ns=right)])
        assert [i.text for i in store.list(left)] == ["drinks tea at five"]
        assert [i.text for i in store.list(right)] == ["drinks coffee at six"]
        store.delete(left, ["same-id"])
        assert store.count(left) == 0 and store.count(right) == 1
        assert [h.item.text for h in store.search(right, "coffee", mode="hybrid")] == ["drinks coffee at six"]
