"""One search: the in-memory store, the LanceDB store and retrieval's snapshot path give the same ids, order and
scores for every mode and every filter operator (they all run :mod:`dualmem.stores.ranking`)."""

from __future__ import annotations

import random

import pytest

from dualmem.errors import ConfigurationError
from dualmem.retrieval import plain
from dualmem.retrieval.snapshot import load
from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import InMemoryDualStore, LanceDualStore
from dualmem.testing import HashEmbeddings

NS = ("agree", "user")
WORDS = (
    "night shift warehouse grey cat pixel video games sister wedding climbing thursday tea garden rain "
    "piano lessons brother moved city quiet evenings bakery early mornings dog walks really like going get"
).split()
QUERIES = ["night shift warehouse", "really like going climbing", "grey cat", "piano brother city", "rain", "zzz"]


def _items() -> list[Fact | Insight]:
    rng = random.Random(41)
    out: list[Fact | Insight] = []
    for n in range(48):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        if n % 11 == 0:
            text = "night shift warehouse"  # identical texts: ties broken by the smaller key on every path
        source = SourceRef(
            session_id=None if n % 9 == 0 else f"s{n % 4}",
            turn_ids=[f"t{n}"],
            chunk_id=None if n % 7 == 0 else f"c{n % 5}",
        )
        event_time = None if n % 8 == 0 else f"2024-{1 + n % 12:02d}-{1 + n % 27:02d}"
        status = "superseded" if n % 10 == 3 else "active"
        if n % 3 == 2:
            out.append(
                Insight(
                    id=f"i{n:02d}",
                    namespace=NS,
                    text=text,
                    grounding=[f"f{n - 1:02d}"],
                    source=source,
                    event_time=event_time,
                    status=status,
                )
            )
        else:
            out.append(
                Fact(id=f"f{n:02d}", namespace=NS, text=text, source=source, event_time=event_time, status=status)
            )
    out.append(Fact(id="elsewhere", namespace=("agree", "other"), text="night shift warehouse grey cat"))
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    items = _items()
    memory = InMemoryDualStore(HashEmbeddings(64))
    lance = LanceDualStore(str(tmp_path_factory.mktemp("agree") / "db"), HashEmbeddings(64))
    for store in (memory, lance):
        store.upsert(items[:30])
        store.upsert(items[30:])  # two commits: rows read from more than one fragment
    return memory, lance


def _same(a, b):
    assert [h.item.id for h in a] == [h.item.id for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)


FILTERS = [
    None,
    {"session_id": "s1"},
    {"session_id": {"$eq": "s2"}},
    {"session_id": {"$ne": "s2"}},
    {"session_id": None},
    {"session_id": {"$ne": None}},
    {"chunk_id": {"$in": ["c1", "c3", 5]}},
    {"event_time": {"$gt": "2024-06-01"}},
    {"event_time": {"$gte": "2024-06-07"}},
    {"event_time": {"$lt": "2024-04-01"}},
    {"event_time": {"$lte": "2024-04-04"}},
    {"event_time": {"$gte": "2024-03-01", "$lt": "2024-09-01"}, "session_id": {"$ne": "s0"}, "chunk_id": "c2"},
    {"id": {"$gt": "f2"}, "status": "active"},
    {"session_id": {"$eq": 3}},  # a text field never equals a number
]


@pytest.mark.parametrize("mode", ["vector", "fts", "hybrid"])
@pytest.mark.parametrize("filt", FILTERS, ids=[str(f) for f in FILTERS])
def test_both_backends_rank_alike_under_every_filter(stores, mode, filt):
    memory, lance = stores
    hits = 0
    for query in QUERIES[:3]:
        for kind in (None, "fact", "insight"):
            found = [s.search(NS, query, kind=kind, k=7, mode=mode, filter=filt) for s in (memory, lance)]
            _same(*found)
            hits += len(found[0])
    assert (hits == 0) == (filt == {"session_id": {"$eq": 3}})  # every other case compares real lists


@pytest.mark.parametrize("mode", ["vector", "fts", "hybrid"])
@pytest.mark.parametrize(("since", "until"), [("2024-03-01", None), (None, "2024-05-10"), ("2024-02-01", "2024-08-01")])
def test_both_backends_rank_alike_in_a_time_window(stores, mode, since, until):
    memory, lance = stores
    for query in QUERIES:
        found = [s.search(NS, query, k=10, mode=mode, since=since, until=until) for s in (memory, lance)]
        _same(*found)
        assert all(h.item.event_time and (since or "") <= h.item.event_time <= (until or "9") for h in found[0])


@pytest.mark.parametrize("mode", ["vector", "fts", "hybrid"])
def test_every_status_k_and_query_agree(stores, mode):
    memory, lance = stores
    for query in QUERIES:
        for status in ("active", "superseded", None):
            for k in (1, 3, 40):
                _same(*(s.search(NS, query, k=k, mode=mode, status=status) for s in (memory, lance)))
    hits = lance.search(NS, "night shift warehouse", k=5, mode=mode)
    assert len(hits) == 5 and {h.item.namespace for h in hits} == {NS}
    if mode != "hybrid":  # identical texts score alike: the smaller key first
        same_text = [h.item.id for h in hits if h.item.text == "night shift warehouse"]
        assert same_text == sorted(same_text) and len(same_text) >= 2


@pytest.mark.parametrize("mode", ["vector", "fts", "hybrid"])
@pytest.mark.parametrize("filt", [None, {"session_id": {"$ne": "s1"}}, {"event_time": {"$lt": "2024-07-01"}}])
def test_the_snapshot_path_ranks_as_the_stores_do(stores, mode, filt):
    memory, lance = stores
    for store in (memory, lance):
        snap = load(store, NS, store.version())
        assert snap is not None
        for query in QUERIES[:4]:
            vector = store.embeddings.embed_query(query)
            for kind in ("fact", "insight"):
                found = plain.search(snap, query, vector, 6, mode, snap.mask(kinds=[kind], filter=filt))
                via_snapshot = [(snap.ids[r], score) for r, score in found]
                via_store = [
                    (h.item.id, h.score) for h in store.search(NS, query, kind=kind, k=6, mode=mode, filter=filt)
                ]
                assert [i for i, _ in via_snapshot] == [i for i, _ in via_store]
                assert [s for _, s in via_snapshot] == pytest.approx([s for _, s in via_store], abs=1e-6)


@pytest.mark.parametrize(
    ("filt", "error", "match"),
    [
        ({"namespace": '["agree", "other"]'}, ConfigurationError, "cannot filter on 'namespace'"),
        ({"session_id": {"$like": "s%"}}, ConfigurationError, "unknown operator"),
        ({"chunk_id": {"$in": "c1"}}, ConfigurationError, r"\$in takes a list"),
        ({"event_time": {"$lt": float("nan")}}, ValueError, "not a finite number"),
        ({"session_id": ["s1"]}, ValueError, "must be a string, number or boolean"),
        ({"session_id": "s\x001"}, ValueError, "NUL character"),
    ],
)
def test_bad_filters_fail_alike_everywhere_even_on_an_empty_namespace(stores, filt, error, match):
    memory, lance = stores
    for store in (memory, lance):
        for ns in (NS, ("agree", "nobody")):
            with pytest.raises(error, match=match):
                store.search(ns, "cat", filter=filt)
        snap = load(store, NS, store.version())
        assert snap is not None
        with pytest.raises(error, match=match):
            snap.mask(filter=filt)
