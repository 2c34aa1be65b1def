"""LLM-free retrieval helpers behind the raw-turns benchmarks: BM25, embedding cache, rankers."""

from __future__ import annotations

import numpy as np
import pytest

from dualmem.retrieval.bm25 import BM25, tokenize
from dualmem.retrieval.cache import CachedEmbeddings, EmbeddingCache
from dualmem.retrieval.sessions import SessionIndex, SessionRankConfig, rank_by_best_item
from dualmem.retrieval.turns import TurnIndex, TurnRankConfig, dense_question
from dualmem.testing import HashEmbeddings


class CountingEmbeddings(HashEmbeddings):
    """Hash embeddings that count how many texts they embedded."""

    def __init__(self, dims: int = 32) -> None:
        super().__init__(dims)
        self.embedded = 0

    def embed_documents(self, texts):
        self.embedded += len(texts)
        return super().embed_documents(texts)


DOCS = [
    "I refill my dad's pill organizer every Sunday",
    "We went climbing on Thursday at the gym",
    "The shipment tracker keeps crashing at work",
    "Climbing shoes are expensive but the climbing gym is fun",
]


def test_tokenize_stems_and_drops_stopwords():
    assert tokenize("I was Climbing, they climbed; the climbs!") == ["climb", "climb", "climb"]


def test_bm25_prefix_uses_only_visible_statistics():
    full = BM25([tokenize(d) for d in DOCS])
    prefix = BM25([tokenize(d) for d in DOCS[:2]])
    query = tokenize("climbing gym thursday")
    assert np.allclose(full.scores(query, upto=2), prefix.scores(query))
    assert not np.allclose(full.scores(query)[:2], prefix.scores(query))  # the future changes idf
    ranked = np.argsort(-full.scores(query))
    assert set(ranked[:2]) == {1, 3} and full.scores(tokenize("pill organizer"))[0] > 0
    assert full.scores(tokenize("unknownword")).sum() == 0


def test_embedding_cache_embeds_each_text_once_and_persists(tmp_path):
    emb = CountingEmbeddings()
    cache = EmbeddingCache(emb, tmp_path, name="t")
    first = cache.embed(DOCS + DOCS[:1])
    assert emb.embedded == len(DOCS)
    assert first.shape == (len(DOCS) + 1, 32) and np.allclose(first[0], first[-1])
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    again = EmbeddingCache(emb, tmp_path, name="t").embed(list(reversed(DOCS)))
    assert emb.embedded == len(DOCS)  # all served from disk
    assert np.allclose(again, first[: len(DOCS)][::-1])
    wrapped = CachedEmbeddings(EmbeddingCache(emb, tmp_path, name="t"))
    assert np.allclose(wrapped.embed_query(DOCS[2]), first[2], atol=1e-6)
    assert not list((tmp_path / "t").glob(".*.tmp"))


def _index(config: SessionRankConfig | None = None) -> tuple[SessionIndex, HashEmbeddings]:
    emb = HashEmbeddings(64)
    index = SessionIndex(dims=64, config=config)
    for i, text in enumerate(DOCS):
        index.add(f"s{i}", np.asarray(emb.embed_documents([text])), text)
    return index, emb


def test_session_index_ranks_the_matching_session_first():
    index, emb = _index()
    query = "who refills the pill organizer on Sunday"
    ranked = index.rank(query, np.asarray(emb.embed_query(query)))
    assert ranked[0][0] == "s0" and len(ranked) == len(DOCS)
    assert [s for s, _ in ranked] == [s for s, _ in sorted(ranked, key=lambda r: -r[1])]
    assert len(index.rank(query, np.asarray(emb.embed_query(query)), k=2)) == 2


def test_session_index_recency_breaks_ties_towards_newer():
    emb = HashEmbeddings(64)
    index = SessionIndex(dims=64, config=SessionRankConfig(w_propagation=0.0))
    for sid in ("old", "new"):
        index.add(sid, np.asarray(emb.embed_documents(["same words here"])), "same words here")
    query = "same words"
    assert index.rank(query, np.asarray(emb.embed_query(query)))[0][0] == "new"
    flat = SessionIndex(dims=64, config=SessionRankConfig(w_recency=0.0, w_propagation=0.0))
    assert len(flat) == 0 and flat.rank(query, np.asarray(emb.embed_query(query))) == []


def test_rank_by_best_item_max_pools():
    assert rank_by_best_item(["a", "b", "a", None, "c"], [0.5, 0.7, 0.9, 1.0, 0.1]) == ["a", "b", "c"]


def test_turn_index_speaker_words_and_neighbour():
    emb = HashEmbeddings(64)
    texts = ["Caroline: I went to a support group yesterday", "Melanie: That's wonderful, how was it?",
             "Melanie: I painted a sunrise last year", "Caroline: Painting is fun"]
    index = TurnIndex(["D1:1", "D1:2", "D2:1", "D2:2"], ["s1", "s1", "s2", "s2"], texts,
                      np.asarray(emb.embed_documents(texts)), TurnRankConfig())
    question = "When did Caroline go to the support group?"
    ranked = index.rank(question, np.asarray(emb.embed_query(question)), k=4)
    assert ranked[0][0] == "D1:1"
    no_smoothing = TurnIndex(index.turn_ids, index.session_ids, texts, index.vectors,
                             TurnRankConfig(w_neighbour=0.0, w_session=0.0))
    with_nb = dict(index.rank(question, np.asarray(emb.embed_query(question)), k=4))
    without = dict(no_smoothing.rank(question, np.asarray(emb.embed_query(question)), k=4))
    assert with_nb["D1:2"] - with_nb["D2:1"] > without["D1:2"] - without["D2:1"]  # the neighbour is lifted
    with pytest.raises(ValueError, match="same length"):
        TurnIndex(["a"], ["s"], ["x", "y"], np.zeros((2, 64)))


def test_turn_index_named_speaker_bonus():
    emb = HashEmbeddings(64)
    texts = ["I adopted a dog named Oscar"] * 2  # only the speaker tells them apart
    vectors = np.asarray(emb.embed_documents(texts))
    question = "What is the name of Melanie's dog?"
    qv = np.asarray(emb.embed_query(question))
    for weight, first in ((5.0, "D1:2"), (0.0, "D1:1")):
        index = TurnIndex(["D1:1", "D1:2"], ["s1", "s1"], texts, vectors, TurnRankConfig(w_speaker=weight),
                          speakers=["Caroline", "Melanie"])
        assert index.rank(question, qv, k=1)[0][0] == first


def test_bm25_tfidf_rows_are_unit_and_query_cosine_matches():
    docs = [tokenize(t) for t in ("bike trip Berlin Copenhagen", "bike repair shop", "tax forms due")]
    index = BM25(docs)
    rows = index.tfidf().toarray()
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0)
    sims = index.tfidf_query(tokenize("Copenhagen bike route"))
    assert sims.argmax() == 0 and sims[2] == 0.0
    assert index.tfidf_query(tokenize("nothing shared")).tolist() == [0.0, 0.0, 0.0]
    assert index.tfidf(upto=2).shape[0] == 2  # statistics of a visible prefix only


def test_session_index_thread_affinity_lifts_sessions_of_the_same_project():
    # "b" shares the query's rare word only through its neighbour "a"; "c" is unrelated but equally dense-similar
    emb = HashEmbeddings(64)
    texts = {"a": "Müritz cycling route Copenhagen hostel", "b": "Copenhagen hostel booking ferry times",
             "c": "quarterly tax forms and receipts"}
    zero = np.zeros((1, 64), np.float32)
    query = "what about the Müritz cycling plan"
    qv = np.asarray(emb.embed_query(query))
    scores = {}
    for weight in (0.0, 2.0):
        cfg = SessionRankConfig(w_dense=0.0, w_reply=0.0, w_context=0.0, w_recency=0.0, w_propagation=0.0,
                                w_bm25=0.0, w_thread=weight)
        index = SessionIndex(dims=64, config=cfg)
        for sid, text in texts.items():
            index.add(sid, zero, text)
        scores[weight] = dict(index.rank(query, qv))
    assert scores[0.0]["b"] == scores[0.0]["c"]
    assert scores[2.0]["b"] > scores[2.0]["c"]


def test_session_index_uses_assistant_turn_vectors_when_given():
    emb = HashEmbeddings(64)
    index = SessionIndex(dims=64, config=SessionRankConfig(w_dense=0.0, w_context=0.0, w_bm25=0.0, w_thread=0.0,
                                                            w_recency=0.0, w_propagation=0.0, w_reply=1.0))
    user = np.asarray(emb.embed_documents(["hello there"]))
    index.add("s0", user, "hello there", np.asarray(emb.embed_documents(["the pill organizer is refilled on Sunday"])))
    index.add("s1", user, "hello there", np.asarray(emb.embed_documents(["climbing gym opens at noon"])))
    query = "pill organizer refilled on Sunday"
    assert index.rank(query, np.asarray(emb.embed_query(query)))[0][0] == "s0"


def test_dense_question_drops_speaker_names_but_keeps_the_rest():
    speakers = ["Caroline", "Melanie"]
    assert dense_question("When did Caroline go to the LGBTQ support group?", speakers) == (
        "When did go to the LGBTQ support group?"
    )
    assert dense_question("What is melanie's dog called?", speakers) == "What is dog called?"
    assert dense_question("Where did Carolineville host the fair?", speakers) == "Where did Carolineville host the fair?"
    assert dense_question("Caroline", speakers) == "Caroline"  # nothing left: the question is kept whole
