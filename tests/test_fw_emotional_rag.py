"""emotional-rag: the four orderings on hand-made scores and vectors, scoring, failures, restarts."""

from __future__ import annotations

import math

import pytest

from dualmem.errors import ConfigurationError
from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.emotional_rag import EmotionalRAGFramework
from dualmem.schema import EMOTIONS, Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer.emotion import (
    EmotionScores,
    cosine,
    cosines,
    emotion_similarity,
    rank_indices,
    rerank,
    score_emotion,
)

# hand-made similarities to one query: (semantic, emotional)
#   item  s     e     s+e   s*e
#   0     0.95  0.05  1.00  0.0475
#   1     0.60  0.60  1.20  0.36
#   2     0.90  0.35  1.25  0.315
#   3     0.30  0.92  1.22  0.276
#   4     0.10  0.99  1.09  0.099
SEM = [0.95, 0.60, 0.90, 0.30, 0.10]
EMO = [0.05, 0.60, 0.35, 0.92, 0.99]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("C-A", [2, 3, 1]),  # sums 1.25 > 1.22 > 1.20
        ("C-M", [1, 2, 3]),  # products 0.36 > 0.315 > 0.276
        ("S-S", [1, 2, 0]),  # semantic top-3 {0, 2, 1} by emotion 0.60 > 0.35 > 0.05
        ("S-E", [1, 3, 4]),  # emotional top-3 {4, 3, 1} by meaning 0.60 > 0.30 > 0.10
        ("", [0, 2, 1]),  # meaning only
    ],
)
def test_four_orderings_on_hand_made_scores(strategy, expected):
    assert rank_indices(strategy, SEM, EMO, k=3, pool=3) == expected


def test_sequential_pool_is_at_least_k():
    # with pool < k the pool grows to k, so every item can still come back
    assert sorted(rank_indices("S-S", SEM, EMO, k=5, pool=2)) == [0, 1, 2, 3, 4]


def test_unknown_strategy_names_the_choices():
    with pytest.raises(ConfigurationError, match="C-A, C-M, S-S, S-E"):
        rank_indices("X", SEM, EMO)


def test_rerank_on_hand_made_vectors():
    query_vec = [1.0, 0.0]
    vectors = [[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]  # semantic cosines 1.0, 0.6, 0.0
    sad = [1, 1, 1, 1, 10, 1, 1, 1]  # |sad|^2 = 107
    joyful = [10, 1, 1, 1, 1, 1, 1, 1]
    flat = [1] * 8
    emotions = [joyful, sad, flat]
    # emotional cosines to `sad`: joyful 26/107 = 0.243, sad 1.0, flat 17/sqrt(107*8) = 0.581
    assert math.isclose(emotion_similarity(sad, joyful), 26 / 107)
    assert math.isclose(emotion_similarity(sad, flat), 17 / math.sqrt(107 * 8))
    # C-A: 1.243, 1.6, 0.581 -> [1, 0, 2];  C-M: 0.243, 0.6, 0.0 -> [1, 0, 2]
    assert [i for i, _ in rerank("C-A", query_vec, sad, vectors, emotions, k=3)] == [1, 0, 2]
    assert [i for i, _ in rerank("C-M", query_vec, sad, vectors, emotions, k=3)] == [1, 0, 2]
    # S-S (pool 2): semantic top-2 {0, 1} by emotion -> [1, 0];  S-E (pool 2): emotional top-2 {1, 2} by meaning -> [1, 2]
    assert [i for i, _ in rerank("S-S", query_vec, sad, vectors, emotions, k=2, pool=2)] == [1, 0]
    assert [i for i, _ in rerank("S-E", query_vec, sad, vectors, emotions, k=2, pool=2)] == [1, 2]
    scores = dict(rerank("C-A", query_vec, sad, vectors, emotions, k=3))
    assert math.isclose(scores[1], 1.6) and math.isclose(scores[0], 1 + 26 / 107)
    # without a query emotion the ranking is by meaning only
    assert [i for i, _ in rerank("C-A", query_vec, None, vectors, emotions, k=3)] == [0, 1, 2]


def test_cosines_match_cosine():
    vectors = [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.5, 3.0]]
    q = [0.5, -1.0, 2.0]
    assert cosines(q, vectors) == pytest.approx([cosine(q, v) for v in vectors])
    assert cosines(q, []) == []


def test_score_emotion_returns_vector_in_schema_order_and_repairs():
    bad = {"joy": "very", "acceptance": 1, "fear": 1, "surprise": 1, "sadness": 1, "disgust": 1, "anger": 1}
    good = {name: i + 1 for i, name in enumerate(EMOTIONS)}
    model = FakeChatModel(responses=[bad, good])
    result = score_emotion(model, "I lost my job today")
    assert result.ok and result.attempts == 2
    assert result.value.vector() == [float(i + 1) for i in range(8)]
    assert "I lost my job today" in str(model.calls[0][-1].content)
    assert not score_emotion(FakeChatModel(responses=["nonsense"]), "x", retries=1).ok
    clamped = {**good, "joy": 0, "anger": 12.5}
    value = score_emotion(FakeChatModel(responses=[clamped]), "x").value
    assert value.joy == 1.0 and value.anger == 10.0 and value.fear == float(EMOTIONS.index("fear") + 1)


def _emotion_for(text: str) -> dict[str, int]:
    scores = {name: 1 for name in EMOTIONS}
    if "funeral" in text or "sorrow" in text:
        scores["sadness"] = 9
    if "party" in text or "won" in text:
        scores["joy"] = 9
    return scores


def _script(messages, tool):
    prompt = str(messages[1].content)
    if tool == "EmotionScores":
        if "unscorable" in prompt:
            return "no json here"
        return _emotion_for(prompt.split("<text>")[1])
    return "ok"


def _framework(tmp_settings, strategy: str | None = None, settings_strategy: str = "") -> EmotionalRAGFramework:
    context = FrameworkContext(
        namespace=("p", "u"),
        settings=tmp_settings.replace(chunk_tokens=14, emotion_strategy=settings_strategy),
        chat_model=FakeChatModel(responses=[_script], cycle=True),
        embeddings=HashEmbeddings(),
    )
    return EmotionalRAGFramework(context, strategy=strategy)


SESSION = Session(
    id="s1",
    time="2024-06-01",
    turns=[
        Turn(id="t0", role="user", text="we had a party after my team won the cup"),
        Turn(id="t1", role="user", text="the funeral was hard and I miss my grandfather"),
        Turn(id="t2", role="user", text="my team plays again next week at home"),
    ],
)


def test_framework_scores_fragments_and_the_query_and_ranks_by_mood(tmp_settings):
    fw = _framework(tmp_settings, strategy="C-A")
    report = fw.ingest(SESSION)
    assert report.items_written == 3 and not report.failed_chunks
    frags = {f["turn_ids"][0]: f for f in fw.fragments()}
    assert frags["t1"]["emotion"][EMOTIONS.index("sadness")] == 9.0
    # a sad query sharing no word with any fragment: the mood decides
    query = "such sorrow today"
    assert not any(set(query.split()) & set(f["text"].split()) for f in frags.values())
    items = fw.retrieve(query, k=3)
    assert items[0].id == frags["t1"]["id"] and items[0].meta["strategy"] == "C-A"
    assert items[0].score - items[1].score > 0.3  # emotion 1.0 vs at most 0.58, meaning near 0 for all
    assert items[0].meta["emotion"]["sadness"] == 9.0
    n_calls = len(fw.context.chat_model.calls)
    fw.retrieve(query, k=3)  # the query's emotion is scored once
    assert len(fw.context.chat_model.calls) == n_calls


def test_strategy_comes_from_argument_then_settings_then_default(tmp_settings):
    assert _framework(tmp_settings).strategy == "C-A"
    assert _framework(tmp_settings, settings_strategy="C-M").strategy == "C-M"
    assert _framework(tmp_settings, strategy="S-S", settings_strategy="C-M").strategy == "S-S"
    with pytest.raises(ConfigurationError):
        _framework(tmp_settings, strategy="sum")


def test_unscorable_fragment_is_recorded_and_kept(tmp_settings):
    fw = _framework(tmp_settings)
    session = Session(id="s2", turns=[Turn(id="u0", role="user", text="an unscorable line of chat about tea")])
    report = fw.ingest(session)
    assert report.failed_chunks == [fw.fragments()[0]["id"]] and report.items_written == 1
    assert fw.fragments()[0]["emotion"] is None
    assert fw.retrieve("tea", k=1)[0].meta["emotion"] == {}


def test_unscorable_query_falls_back_to_meaning(tmp_settings):
    fw = _framework(tmp_settings)
    fw.ingest(SESSION)
    items = fw.retrieve("unscorable team cup", k=2)
    assert items[0].meta["strategy"] == ""


def test_fragments_survive_restart_and_reingest_adds_nothing(tmp_settings):
    fw = _framework(tmp_settings)
    fw.ingest(SESSION)
    chat = FakeChatModel(responses=[_script], cycle=True)
    again = open_framework(
        "emotional-rag",
        FrameworkContext(
            namespace=("p", "u"),
            settings=tmp_settings.replace(chunk_tokens=14),
            chat_model=chat,
            embeddings=HashEmbeddings(),
        ),
    )
    assert len(again.fragments()) == 3
    assert again.ingest(SESSION).items_written == 0 and chat.calls == []
    assert EmotionScores.model_validate(_emotion_for("party")).joy == 9
