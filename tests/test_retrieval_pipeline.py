"""The one retrieval pipeline (dualmem.retrieval): ranker, weights, context, and every reader that ranks with it.

Real LanceDB on disk; deterministic hash embeddings (texts sharing words are
close). A weights file that puts all its weight on one feature shows which
path ranked: only the pipeline computes features.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.retrieval import Ranker, RankerWeights, context_turns, load_weights
from dualmem.retrieval.features import FEATURES
from dualmem.retrieval.pipeline import order, strip_names
from dualmem.retrieval.weights import shipped_path
from dualmem.schema import Fact, Insight, Session, SourceRef, Turn
from dualmem.stores import LanceDualStore
from dualmem.stores.contract import GetItems
from dualmem.testing import HashEmbeddings

NS = ("sophie", "u1")


def only(feature: str, tmp_path, **kwargs) -> str:
    """Write weights that rank by one feature alone; return the file path."""
    path = tmp_path / f"{feature}.json"
    RankerWeights((feature,), (1.0,), **kwargs).save(path)
    return str(path)


def _session(sid: str, day: int, *lines: tuple[str, str, str]) -> Session:
    return Session(
        id=sid,
        time=f"2024-01-{day:02d}",
        turns=[
            Turn(id=f"{sid}-{i}", role=role, speaker=speaker, text=text)
            for i, (role, speaker, text) in enumerate(lines)
        ],
    )


SESSIONS = [
    _session(
        "s1",
        1,
        ("user", "Sophie", "I start my thesis on urban gardens"),
        ("assistant", "Ada", "Great, what is the first step"),
    ),
    _session(
        "s2",
        2,
        ("user", "Sophie", "My bike chain broke on the way to the lab"),
        ("assistant", "Ada", "Sorry to hear about the bike"),
    ),
    _session(
        "s3",
        3,
        ("user", "Sophie", "The thesis committee meets on Friday"),
        ("assistant", "Ada", "Prepare the garden data"),
    ),
    _session("s4", 4, ("user", "Sophie", "Caroline lent me her bike pump"), ("assistant", "Ada", "Nice of Caroline")),
]


@pytest.fixture
def raw(tmp_path):
    ctx = FrameworkContext(
        namespace=NS, settings=Settings(store_uri=str(tmp_path / "db")), embeddings=HashEmbeddings(64)
    )
    fw = open_framework("raw-turns", ctx)
    for s in SESSIONS:
        fw.ingest(s)
    return fw


def test_the_default_ranker_is_the_shipped_learned_one_and_its_file_names_its_features():
    assert Settings().tuning.ranker == "learned"
    weights = load_weights("learned")
    assert set(weights.features) <= set(FEATURES) and any(w != 0 for w in weights.weights)
    data = json.loads(shipped_path().read_text())
    assert (
        data["format"] == "dualmem-ranker/1" and "held_out" not in data["meta"]
    )  # fitted on everything: the product's


def test_raw_turns_stores_each_turn_with_its_speaker_and_ranks_with_the_pipeline(raw):
    hits = raw.retrieve("the thesis committee", k=3)
    assert hits[0].text == "Sophie: The thesis committee meets on Friday" and hits[0].source_session == "s3"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert isinstance(raw.ranker, Ranker) and raw.ranker.spec == "learned"


def test_a_weights_file_changes_what_raw_turns_returns(raw, tmp_path):
    raw.ranker = Ranker(only("recent_3", tmp_path))
    assert raw.retrieve("thesis", k=1)[0].source_session == "s4"  # recency alone: the last session, whatever the words
    raw.ranker = Ranker(only("dense", tmp_path))
    assert raw.retrieve("thesis committee Friday", k=1)[0].source_session == "s3"


def test_context_lifts_the_session_the_conversation_is_about(raw, tmp_path):
    raw.ranker = Ranker(only("ctx_bm25", tmp_path))
    no_context = raw.retrieve("what did you say", k=1)
    bike = raw.retrieve(
        "what did you say", k=1, context=["my bike chain", {"role": "assistant", "content": "the lab trip"}]
    )
    garden = raw.retrieve("what did you say", k=1, context=[Turn(id="x", role="user", text="urban gardens thesis")])
    assert bike[0].source_session == "s2" and garden[0].source_session == "s1"
    assert no_context  # without context the feature is 0 for all: still a ranked answer


def test_session_cap_and_cap_after_order_the_list():
    scores, session = np.array([0.9, 0.8, 0.7, 0.6, 0.1]), np.array([0, 0, 0, 1, 2])
    assert order(scores, session, 5).tolist() == [0, 1, 2, 3, 4]
    assert order(scores, session, 3, max_per_session=1).tolist() == [0, 3, 4]
    assert order(scores, session, 4, max_per_session=1, cap_after=2).tolist() == [0, 1, 3, 4]


def test_names_are_taken_out_of_the_query_vector_but_role_labels_stay():
    assert strip_names("When did Caroline's sister visit?", ["Caroline"]) == "When did sister visit?"
    assert strip_names("Caroline", ["Caroline"]) == "Caroline"  # nothing left: the query as it was


def test_context_accepts_strings_turns_messages_and_dicts():
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    turns = context_turns(
        [
            "hi",
            Turn(id="t", role="user", speaker="Mel", text="hello"),
            HumanMessage("q"),
            AIMessage("a"),
            SystemMessage("rules"),
            {"role": "assistant", "content": [{"type": "text", "text": "blocks"}]},
            {"text": " "},
        ]
    )
    assert [(t.role, t.text) for t in turns] == [
        ("user", "hi"),
        ("user", "Mel: hello"),
        ("user", "q"),
        ("assistant", "a"),
        ("assistant", "blocks"),
    ]
    assert [t.text for t in context_turns(["a", "b", "c"], last=2)] == ["b", "c"]


def test_bad_ranker_specs_and_weight_files_name_the_fix(tmp_path):
    with pytest.raises(ConfigurationError, match="learned"):
        Ranker("bm25")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "dualmem-ranker/1", "features": ["no_such_feature"], "weights": [1.0]}))
    with pytest.raises(ConfigurationError, match="refit"):
        Ranker(str(bad))
    bad.write_text("{}")
    with pytest.raises(ConfigurationError, match="not a dualmem ranker weights file"):
        Ranker(str(bad))


def test_plain_rankers_are_the_store_search(raw):
    vector = Ranker("vector").rank(raw.store, NS, "bike pump", 2, kinds=("fact",))
    assert [h.item.id for h in vector] == [
        h.item.id for h in raw.store.search(NS, "bike pump", kind="fact", k=2, mode="vector")
    ]


def test_ranking_stays_in_its_namespace_and_sees_new_rows_at_once(tmp_path):
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store.upsert(
        [
            Fact(id="a", namespace=NS, text="climbing on thursday", source=SourceRef(session_id="s1")),
            Fact(id="b", namespace=("other", "u1"), text="climbing on thursday", source=SourceRef(session_id="s1")),
        ]
    )
    ranker = Ranker()
    assert [h.item.id for h in ranker.rank(store, NS, "climbing", 5)] == ["a"]
    store.upsert([Fact(id="c", namespace=NS, text="climbing gym on friday", source=SourceRef(session_id="s2"))])
    assert {h.item.id for h in ranker.rank(store, NS, "climbing", 5)} == {"a", "c"}
    assert ranker.rank(store, ("nobody", "u1"), "climbing", 5) == []


def _dual_store(tmp_path) -> LanceDualStore:
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store.upsert(
        [
            Fact(id="f1", namespace=NS, text="works night shifts at the warehouse", source=SourceRef(session_id="s1")),
            Fact(id="f2", namespace=NS, text="plays games until 3 am", source=SourceRef(session_id="s2")),
            Insight(
                id="i1",
                namespace=NS,
                text="tired from night shifts, not lazy",
                grounding=["f1"],
                source=SourceRef(session_id="s2"),
            ),
        ]
    )
    return store


def test_dualmem_framework_ranks_facts_and_insights_with_the_pipeline(tmp_path):
    store = _dual_store(tmp_path)
    ctx = FrameworkContext(
        namespace=NS,
        settings=Settings(store_uri=str(tmp_path / "db"), ranker=only("recent_3", tmp_path)),
        embeddings=store.embeddings,
        store=store,
    )
    fw = open_framework("dualmem", ctx)
    items = fw.retrieve("night shifts", k=4, context=["I could not sleep"])
    assert {i.kind for i in items} == {"fact", "insight"}
    facts = [i for i in items if i.kind == "fact"]
    assert facts[0].id == "f2"  # recency alone: the later session's fact first
    insight = next(i for i in items if i.kind == "insight")
    assert insight.meta["grounding_texts"] == ["works night shifts at the warehouse"]


def test_retriever_and_search_tool_rank_with_the_pipeline(tmp_path):
    from dualmem.retrieval.retriever import DualMemRetriever
    from dualmem.retrieval.tools import create_search_memory_tool

    store = _dual_store(tmp_path)
    recency = Ranker(only("recent_3", tmp_path))
    docs = DualMemRetriever(store=store, namespace=NS, k=1, ranker=recency, kind="fact").invoke(
        "warehouse night shifts"
    )
    assert [d.metadata["id"] for d in docs] == ["f2"]
    dense = DualMemRetriever(store=store, namespace=NS, k=1, kind="fact", ranker=only("dense", tmp_path)).invoke(
        "warehouse night shifts"
    )
    assert [d.metadata["id"] for d in dense] == ["f1"]
    tool = create_search_memory_tool(NS, store=store, ranker=recency)
    hits = json.loads(tool.invoke({"query": "warehouse night shifts", "limit": 3}))
    assert hits[0]["session_id"] == "s2" and {h["kind"] for h in hits} == {"fact", "insight"}


def test_grounding_reads_the_store_only_for_cited_facts_that_are_no_longer_active(tmp_path, monkeypatch):
    store = _dual_store(tmp_path)
    reads: list[list[str]] = []
    batch = store.batch
    monkeypatch.setattr(
        store, "batch", lambda ops: reads.extend(list(o.ids) for o in ops if isinstance(o, GetItems)) or batch(ops)
    )
    ranker = Ranker()
    result = ranker.dual(store, NS, "night shifts", 2, 2)
    assert [f.id for f in result.grounding["i1"]] == ["f1"] and reads == []  # the cited fact came from the snapshot
    assert result.grounding == store.grounding(NS, [h.item for h in result.insights])
    store.supersede(NS, ["f1"])  # cited, no longer active: read from the store, as the store's own grounding does
    reads.clear()
    result = ranker.dual(store, NS, "night shifts", 2, 2)
    assert reads == [["f1"]] and [(f.id, f.status) for f in result.grounding["i1"]] == [("f1", "superseded")]


def test_a_recall_grounds_its_insights_at_the_version_it_ranked(tmp_path, monkeypatch):
    """A write that lands between ranking and grounding does not show in the grounding (nor costs a refresh): one
    store version serves the whole recall."""
    store = _dual_store(tmp_path)
    versions = []
    version = store.version
    monkeypatch.setattr(store, "version", lambda: versions.append(1) or version())
    ranker, writes = Ranker(), []
    ranked = ranker._ranked

    def ranked_then_a_write(*args, **kwargs):
        out = ranked(*args, **kwargs)
        writes.append(1)
        text = f"works days now ({len(writes)})"
        store.upsert([Fact(id="f1", namespace=NS, text=text, source=SourceRef(session_id="s9"))])
        return out

    monkeypatch.setattr(ranker, "_ranked", ranked_then_a_write)
    result = ranker.dual(store, NS, "night shifts", 2, 2)
    assert [f.text for f in result.grounding["i1"]] == ["works night shifts at the warehouse"] and len(versions) == 1
    monkeypatch.setattr(ranker, "_ranked", ranked)
    assert [f.text for f in ranker.dual(store, NS, "night shifts", 2, 2).grounding["i1"]] == ["works days now (1)"]
    versions.clear()  # the LangChain retriever: one version for its documents and their grounding too
    monkeypatch.setattr(ranker, "_ranked", ranked_then_a_write)
    from dualmem.retrieval.retriever import DualMemRetriever

    docs = DualMemRetriever(store=store, namespace=NS, ranker=ranker, k=4, merged=True).invoke("night shifts")
    [insight] = [d for d in docs if d.metadata["id"] == "i1"]
    assert [f["text"] for f in insight.metadata["grounding_facts"]] == ["works days now (1)"] and len(versions) == 1


class _CountingEmbeddings(HashEmbeddings):
    asymmetric = False  # a query is embedded as a document: the ranker remembers it

    def __init__(self, dims: int) -> None:
        super().__init__(dims)
        self.queries = 0

    def embed_query(self, text: str) -> list[float]:
        self.queries += 1
        return super().embed_query(text)


def test_remembered_query_vectors_are_reused_until_forgotten(tmp_path):
    emb = _CountingEmbeddings(64)
    store = LanceDualStore(str(tmp_path / "db"), emb)
    store.upsert([Fact(id="a", namespace=NS, text="climbing on thursday", source=SourceRef(session_id="s1"))])
    ranker = Ranker()
    first = [h.item.id for h in ranker.rank(store, NS, "climbing", 5)]
    ranker.rank(store, NS, "climbing", 5)
    assert emb.queries == 1  # the second time the vector was remembered
    ranker.forget()
    assert [h.item.id for h in ranker.rank(store, NS, "climbing", 5)] == first
    assert emb.queries == 2


def test_one_ranking_at_any_size_300k_rows(tmp_path):
    """A namespace of 300,000 items is ranked like a small one: by the learned ranker over the RAM snapshot (there is
    no size above which retrieval switches to another ranking), and the store's own hybrid search of it returns what
    the snapshot's hybrid ranking does (one search implementation)."""
    from dualmem.retrieval import Ranker
    from dualmem.schema import Fact, SourceRef
    from dualmem.stores import LanceDualStore
    from dualmem.testing import HashEmbeddings

    words = ["tomato", "river", "violin", "exam", "garden", "lisbon", "night", "shift", "dog", "biscuit", "clinic"]
    ns, n = ("p", "u"), 300_000
    items = [
        Fact(
            id=f"f{i:06d}",
            namespace=ns,
            text=f"{words[i % 11]} {words[(i // 11) % 11]} note {i}",
            source=SourceRef(session_id=f"s{i // 100:05d}"),
        )
        for i in range(n)
    ]
    items.append(
        Fact(
            id="needle",
            namespace=ns,
            text="my sister Alma plays the theremin in Oslo",
            source=SourceRef(session_id="s01234"),
        )
    )
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(32))
    store.upsert(items)
    learned = Ranker("learned")
    assert [h.item.id for h in learned.rank(store, ns, "theremin in Oslo", 3)][0] == "needle"
    assert len(learned.snapshots.get(store, ns)) == n + 1  # held in RAM, whatever its size
    query = "garden exam theremin"
    plain = [(h.item.id, round(h.score, 6)) for h in Ranker("hybrid").rank(store, ns, query, 10)]
    searched = store.search(ns, query, kind="fact", k=10, mode="hybrid", vector=store.embeddings.embed_query(query))
    assert plain == [(h.item.id, round(h.score, 6)) for h in searched]
