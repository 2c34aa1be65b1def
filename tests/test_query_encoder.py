"""Fine-tuning the query side of the bundled embedder against frozen document vectors."""

from __future__ import annotations

import numpy as np
import pytest

from dualmem.retrieval.query_encoder import QueryEncoderConfig, QueryGroup, encode_queries, finetune_query_encoder

DOCS = [
    "I adopted a grey kitten from the shelter last week.",
    "My sister is getting married in Lisbon in June.",
    "We finally fixed the leaking pipe under the kitchen sink.",
    "I started learning the cello, the scales are hard.",
    "The marathon is in October, I run every morning now.",
    "Our team shipped the new billing system on Friday.",
]
# Labels that disagree with what the questions look like (music -> the kitten, ...): only training can
# move the questions there, so a rise of the positives' probability is the fine-tuning's doing.
QUESTIONS = [
    ("What instrument does she practise?", 0),
    ("Which musical hobby did she take up?", 0),
    ("What did they repair at home?", 4),
    ("What plumbing problem was solved?", 4),
    ("Whose wedding is coming up?", 5),
    ("Which family event is planned abroad?", 5),
]


@pytest.fixture(scope="module")
def model():
    from sentence_transformers import SentenceTransformer

    from dualmem.local.bundled import bundled_embedder_path

    return SentenceTransformer(str(bundled_embedder_path()), device="cpu")


@pytest.fixture
def fresh(model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    yield model
    model.load_state_dict(state)


def _group(model, questions=QUESTIONS) -> QueryGroup:
    docs = model.encode(DOCS, normalize_embeddings=True)
    return QueryGroup(docs, [q for q, _ in questions], [[p] for _, p in questions])


def _positive_probability(model, group: QueryGroup, temperature: float = 0.05) -> float:
    scores = encode_queries(model, group.queries) @ np.asarray(group.doc_vectors).T / temperature
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    return float(np.mean([probs[i, pos].sum() for i, pos in enumerate(group.positives)]))


def test_encode_queries_matches_the_embedder_before_training(model):
    vectors = encode_queries(model, ["What instrument does she practise?", "Whose wedding?"])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(
        vectors, model.encode(["What instrument does she practise?", "Whose wedding?"], normalize_embeddings=True), atol=1e-5
    )
    assert encode_queries(model, []).shape == (0, 384)


def test_training_moves_questions_towards_their_documents_and_leaves_documents_alone(fresh):
    group = _group(fresh)
    docs_before = np.array(group.doc_vectors, copy=True)
    before = _positive_probability(fresh, group)
    losses = finetune_query_encoder(
        fresh, [group], QueryEncoderConfig(epochs=6, learning_rate=1e-4, batch_size=3), progress=None
    )
    after = _positive_probability(fresh, group)
    assert len(losses) == 6 * 2  # two batches of three questions per epoch
    assert np.mean(losses[-2:]) < np.mean(losses[:2])
    assert before < 0.05 and after > 0.5, (before, after)
    np.testing.assert_array_equal(np.asarray(group.doc_vectors), docs_before)
    assert not fresh.training  # left in eval mode


def test_same_seed_same_model(fresh, model):
    group = _group(fresh)
    config = QueryEncoderConfig(epochs=1, batch_size=2, seed=7)
    start = {k: v.clone() for k, v in fresh.state_dict().items()}
    first = finetune_query_encoder(fresh, [group], config)
    fresh.load_state_dict(start)
    second = finetune_query_encoder(fresh, [group], config)
    assert first == pytest.approx(second, rel=1e-5)


def test_questions_without_positives_are_skipped_and_none_at_all_is_an_error(fresh):
    docs = fresh.encode(DOCS, normalize_embeddings=True)
    mixed = QueryGroup(docs, ["What instrument?", "Unanswerable?"], [[0], []])
    assert len(finetune_query_encoder(fresh, [mixed], QueryEncoderConfig(epochs=1, batch_size=4))) == 1
    with pytest.raises(ValueError, match="no question has a positive"):
        finetune_query_encoder(fresh, [QueryGroup(docs, ["Unanswerable?"], [[]])])


def test_bad_groups_say_what_is_wrong():
    docs = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match=r"query 0: positive indices \[3\] out of range 0\.\.2"):
        QueryGroup(docs, ["q"], [[3]])
    with pytest.raises(ValueError, match="2 queries but 1 positive lists"):
        QueryGroup(docs, ["q", "r"], [[0]])
    with pytest.raises(ValueError, match="non-empty 2-D array"):
        QueryGroup(np.zeros((0, 3)), [], [])


def test_query_tuned_embeddings_route_documents_and_queries():
    from dualmem.retrieval import QueryTunedEmbeddings
    from dualmem.testing import HashEmbeddings

    documents, queries = HashEmbeddings(16), HashEmbeddings(8)  # told apart by their sizes
    both = QueryTunedEmbeddings(documents, queries)
    assert both.embed_documents(["a cat", "a dog"]) == documents.embed_documents(["a cat", "a dog"])
    assert both.embed_query("a cat") == queries.embed_query("a cat")
    assert len(both.embed_query("a cat")) == 8
