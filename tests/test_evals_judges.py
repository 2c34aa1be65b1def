"""LLM judges with scripted fake models: parsing, repetitions, repair, surfaced errors, LangSmith offline."""

from __future__ import annotations

import pytest

from dualmem.evals.journal import Journal
from dualmem.evals.judges import (
    ROLEPLAY_KEYS,
    apply_judges,
    judges_for,
    locomo_correctness_judge,
    realmem_answer_judge,
    realmem_memory_judge,
    roleplay_judge,
    roleplay_judges,
)
from dualmem.evals.langsmith_adapter import Judging
from dualmem.testing import FakeChatModel

INPUTS = {"question": "Why am I so snappy lately?", "persona": "Name: Mara\nRole: night-shift nurse"}
OUTPUTS = {"answer": "You are exhausted, not mean.", "retrieved": ["works nights", "stopped climbing"]}
REFERENCE = {
    "facts": ["Theo answers emails at midnight."],
    "insight": "Mara reads it as exhaustion.",
    "answer": "gold",
    "memory_points": ["User works nights.", "User quit climbing."],
}


def test_roleplay_judge_averages_three_repetitions_and_keeps_them():
    model = FakeChatModel(
        responses=[{"reasoning": "a", "score": 3}, {"reasoning": "b", "score": 4}, {"reasoning": "c", "score": 5}]
    )
    res = roleplay_judge("information_richness", model)(INPUTS, OUTPUTS, REFERENCE)
    assert res["key"] == "information_richness"
    assert res["score"] == pytest.approx(4.0)
    assert res["extra"]["repetitions"] == [3, 4, 5] and res["extra"]["errors"] == []
    assert "[3, 4, 5]" in res["comment"]
    assert len(model.calls) == 3
    prompt = model.calls[0][-1].content  # the judge sees persona, gold insight, gold facts, question and answer
    for text in ("Mara", "exhaustion", "emails at midnight", "snappy", "not mean"):
        assert text in prompt


def test_judge_repairs_unparseable_and_out_of_range_answers():
    model = FakeChatModel(
        responses=["I think it is good", {"reasoning": "x", "score": 9}, {"reasoning": "ok", "score": 2}]
    )
    res = roleplay_judge("logical_quality", model, repetitions=1)(INPUTS, OUTPUTS, REFERENCE)
    assert res["score"] == 2.0 and res["extra"]["errors"] == []
    assert len(model.calls) == 3  # two repairs
    assert "could not be used" in model.calls[1][-1].content


def test_judge_failure_is_an_error_not_a_zero():
    model = FakeChatModel(responses=["no json here"], cycle=True)
    res = roleplay_judge("character_consistency", model, repetitions=2)(INPUTS, OUTPUTS, REFERENCE)
    assert res["score"] is None
    assert len(res["extra"]["errors"]) == 2 and res["comment"].startswith("error:")
    scores, errors = apply_judges(
        [roleplay_judge("character_consistency", model, repetitions=1)], INPUTS, OUTPUTS, REFERENCE
    )
    assert scores["character_consistency"]["score"] is None and errors and "unparseable" in errors[0]


def test_partial_failure_averages_only_successful_repetitions():
    model = FakeChatModel(
        responses=[{"reasoning": "a", "score": 4}, "junk", "junk", "junk", {"reasoning": "c", "score": 2}]
    )
    res = roleplay_judge("conversational_attractiveness", model)(INPUTS, OUTPUTS, REFERENCE)
    assert res["score"] == pytest.approx(3.0)
    assert res["extra"]["repetitions"] == [4, None, 2] and len(res["extra"]["errors"]) == 1


def test_roleplay_judges_cover_the_four_dimensions():
    judges = roleplay_judges(FakeChatModel(responses=[{"reasoning": "", "score": 1}]), repetitions=1)
    assert [j.__name__ for j in judges] == list(ROLEPLAY_KEYS) and len(ROLEPLAY_KEYS) == 4
    with pytest.raises(ValueError, match="dimension"):
        roleplay_judge("wit", FakeChatModel())


def test_realmem_judges():
    ans = realmem_answer_judge(FakeChatModel(responses=[{"reasoning": "uses all", "score": 3}]))(
        INPUTS, OUTPUTS, REFERENCE
    )
    assert ans["key"] == "realmem_answer" and ans["score"] == 3.0
    bad = realmem_answer_judge(FakeChatModel(responses=[{"reasoning": "", "score": 4}], cycle=True))(
        INPUTS, OUTPUTS, REFERENCE
    )
    assert bad["score"] is None  # 4 is outside 0-3, repaired twice, then reported
    model = FakeChatModel(responses=[{"reasoning": "half", "recall": 0.5, "score": 1}])
    mem = realmem_memory_judge(model, top_k=1)(INPUTS, OUTPUTS, REFERENCE)
    assert {r["key"]: r["score"] for r in mem["results"]} == {"mem_recall": 0.5, "mem_helpfulness": 1.0}
    assert "works nights" in model.calls[0][-1].content and "stopped climbing" not in model.calls[0][-1].content
    assert realmem_memory_judge(model)(INPUTS, OUTPUTS, {"memory_points": []}) == {"results": []}


def test_locomo_correctness_and_protocol_sets():
    res = locomo_correctness_judge(FakeChatModel(responses=[{"reasoning": "same date", "score": 1}]))(
        {"question": "When?"}, {"answer": "7 May 2023"}, {"answer": "7 May 2023"}
    )
    assert res == {**res, "key": "locomo_correctness", "score": 1.0}
    fake = FakeChatModel(responses=[{"reasoning": "", "score": 1}])
    assert [j.__name__ for j in judges_for("realmem", fake)] == ["realmem_answer", "realmem_memory"]
    assert len(judges_for("rolememo", fake)) == 4 and len(judges_for("locomo", fake)) == 1


def test_langsmith_evaluate_offline_records_each_verdict_once(monkeypatch, tmp_path):
    monkeypatch.delenv("LANGSMITH_API_KEY", raising=False)
    monkeypatch.delenv("LANGCHAIN_API_KEY", raising=False)
    records = [
        {
            "persona": "p",
            "query_id": f"q{i}",
            "query": f"question {i}",
            "reference_answer": "gold",
            "errors": [],
            "gold": {"facts": ["f"], "insight": "i", "memory_points": []},
            "answer": f"answer {i}",
            "retrieved": [{"text": "t", "expanded": False}],
        }
        for i in range(2)
    ]
    scripted = FakeChatModel(
        responses=[lambda msgs: {"reasoning": "", "score": 5 if "answer 1" in msgs[-1].content else 1}], cycle=True
    )
    judging = Judging([roleplay_judge("logical_quality", scripted, repetitions=3)])
    assert [e.inputs["query_id"] for e in judging.examples(records, "persona text")] == ["q0", "q1"]
    journal = Journal(tmp_path / "j.sqlite").scope("p")
    out = {r["query_id"]: r for r in judging.judge(records, "persona text", journal)}
    assert (
        out["q0"]["judges"]["logical_quality"]["score"] == 1.0
        and out["q1"]["judges"]["logical_quality"]["score"] == 5.0
    )
    assert out["q1"]["judges"]["logical_quality"]["extra"]["repetitions"] == [5, 5, 5]
    assert len(scripted.calls) == 6
    again = judging.judge(records, "persona text", journal)  # a resumed run: verdicts come from the journal
    assert len(scripted.calls) == 6 and [r["judges"] for r in again] == [out["q0"]["judges"], out["q1"]["judges"]]
