"""Emotion-aware DualMem (Settings.emotion_strategy): the writer scores items, retrieval reranks."""

from __future__ import annotations

import pytest

from dualmem.graphs.respond import respond
from dualmem.schema import EMOTIONS, Persona, Session, Turn
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer import write_history

PERSONA = Persona(id="dr-lee", name="Dr. Lee")
NS = ("dr-lee", "user")
FACTS = {"s0": "adopted a rescue dog named Biscuit", "s1": "failed the nursing exam in spring"}


def _scores(**high: int) -> dict[str, int]:
    return {name: high.get(name, 1) for name in EMOTIONS}


def _model(query_mood: str):
    def answer(messages, tool=None):
        text = "\n".join(str(m.content) for m in messages)
        if tool == "MemoryUpdate":
            sid = next(s for s in FACTS if f"[{s}t0]" in text)
            return {"facts": [{"op": "ADD", "id": "N1", "text": FACTS[sid], "turn_ids": [f"{sid}t0"]}], "insights": []}
        if tool == "EmotionScores":
            if "Biscuit" in text:
                return _scores(joy=10)
            if "nursing exam" in text:
                return _scores(sadness=10)
            return _scores(**{query_mood: 10})
        return "reply"

    return FakeChatModel(responses=[answer], cycle=True)


@pytest.fixture
def store(tmp_path):
    return LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))


def _write(settings, store, model):
    sessions = [Session(id=sid, turns=[Turn(id=f"{sid}t0", role="user", text=text)]) for sid, text in FACTS.items()]
    return write_history(
        sessions, PERSONA, settings=settings, model=model, store=store, progress=False, checkpointer=False
    )


def test_writer_scores_emotions_and_reranking_follows_the_query_mood(tmp_settings, store):
    settings = tmp_settings.replace(emotion_strategy="C-A")
    report = _write(settings, store, _model("sadness"))
    assert all(not row["emotion_failed"] for row in report.chunks)
    emotions = {f.text: f.emotion for f in store.list(NS, kind="fact")}
    assert emotions[FACTS["s0"]][EMOTIONS.index("joy")] == 10
    assert emotions[FACTS["s1"]][EMOTIONS.index("sadness")] == 10

    query = "tell me about my dog"
    plain = respond(query, PERSONA, settings=tmp_settings, model=_model("sadness"), store=store, k=2)
    assert plain.facts[0].item.text == FACTS["s0"]  # by meaning alone, the dog
    sad = respond(query, PERSONA, settings=settings, model=_model("sadness"), store=store, k=2)
    assert sad.facts[0].item.text == FACTS["s1"]  # a sad query brings the sad memory first
    happy = respond(query, PERSONA, settings=settings, model=_model("joy"), store=store, k=2)
    assert happy.facts[0].item.text == FACTS["s0"]


def test_failed_emotion_scoring_is_reported_not_dropped(tmp_settings, store):
    def answer(messages, tool=None):
        if tool == "MemoryUpdate":
            return {"facts": [{"op": "ADD", "id": "N1", "text": "adopted a rescue dog named Biscuit", "turn_ids": []}]}
        return "not json"

    settings = tmp_settings.replace(emotion_strategy="S-S", max_retries=0)
    report = _write(settings, store, FakeChatModel(responses=[answer], cycle=True))
    row = report.chunks[0]
    assert row["status"] == "applied" and len(row["emotion_failed"]) == 1
    (fact,) = store.list(NS, kind="fact")
    assert fact.emotion is None and fact.id == row["emotion_failed"][0]
