"""Generator checks on hand-made passing and failing cases: difficulty, safety, time firewall."""

from __future__ import annotations

import pytest

from dualmem.context import context_of
from dualmem.generators.checks import (
    difficulty_check,
    flag_turns,
    fragment_overlap,
    mentions_future,
    safety_flags,
    units,
)
from dualmem.generators.weave import check_safety
from dualmem.testing import FakeChatModel, HashEmbeddings

FRAGS = ["I work night shifts at the warehouse", "I skipped lunch to finish a puzzle"]


def dialogue(*user_lines: str, replies: tuple[str, ...] = ()) -> list[dict[str, str]]:
    turns = []
    for i, line in enumerate(user_lines):
        turns.append({"role": "user", "text": line})
        turns.append({"role": "assistant", "text": replies[i] if i < len(replies) else "That sounds like a calm week."})
    return turns


def test_fragments_once_each_pass():
    turns = dialogue(
        "The weather turned cold today.",
        "Since I work night shifts at the warehouse, mornings are my evenings.",
        "Did you see the festival posters?",
        "I skipped lunch to finish a puzzle, the sky one with a thousand pieces.",
    )
    result = difficulty_check(turns, FRAGS)
    assert result.ok, result.reasons
    assert result.fragment_turns == [2, 6]


def test_paraphrased_fragment_counts_as_present():
    turns = dialogue(
        "Been doing the night shift at the warehouse for a month now, weird hours.",
        "Puzzle day: skipped my lunch just to finish it.",
    )
    assert difficulty_check(turns, FRAGS).ok
    # with embeddings too, the same turns pass
    assert difficulty_check(turns, FRAGS, embeddings=HashEmbeddings(128)).ok


def test_missing_fragment_fails():
    turns = dialogue("I work night shifts at the warehouse.", "Nothing else new.")
    result = difficulty_check(turns, FRAGS)
    assert not result.ok
    assert any("fragment 2" in r and "no user turn" in r for r in result.reasons)


def test_echoed_fragment_fails():
    turns = dialogue(
        "I work night shifts at the warehouse, so I sleep late.",
        "I skipped lunch to finish a puzzle.",
        replies=("Night shifts at the warehouse, you work? That's tough.", "Nice."),
    )
    result = difficulty_check(turns, FRAGS)
    assert not result.ok
    assert any("echoed" in r and "fragment 1" in r for r in result.reasons)


def test_fragment_in_two_user_turns_fails():
    turns = dialogue(
        "I work night shifts at the warehouse.",
        "As I said, night shifts at the warehouse again.",
        "I skipped lunch to finish a puzzle.",
    )
    result = difficulty_check(turns, FRAGS)
    assert not result.ok
    assert "expected exactly one" in " ".join(result.reasons)


def test_thresholds_are_parameters():
    turns = dialogue("Night work lately.", "I skipped lunch to finish a puzzle.")
    assert not difficulty_check(turns, FRAGS).ok
    assert difficulty_check(turns, FRAGS, overlap_threshold=0.3).ok


def test_chinese_dialogue_by_character_ngrams():
    frags = ["我在仓库上夜班", "我为了拼完拼图没吃午饭"]
    turns = dialogue(
        "今天天气有点冷。", "最近一直在仓库上夜班，早上才睡觉。", "周末打算去看展览。", "昨天为了拼完拼图，午饭都没吃。"
    )
    assert units("仓库")
    result = difficulty_check(turns, frags)
    assert result.ok, result.reasons
    echoed = dialogue(
        "最近一直在仓库上夜班。", "昨天为了拼完拼图，午饭都没吃。", replies=("你在仓库上夜班啊，辛苦了。", "好的。")
    )
    assert not difficulty_check(echoed, frags).ok


def test_overlap_is_a_share():
    assert fragment_overlap("night shifts warehouse", "warehouse") == pytest.approx(1 / 3)
    assert fragment_overlap("", "anything") == 0.0


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("write to theo.k@example.org tomorrow", "email"),
        ("my number is 415-555-0132", "phone"),
        ("card 4111 1111 1111 1111 expires soon", "id_number"),
        ("SSN 123-45-6789", "id_number"),
        ("他的身份证号是11010519491231002X", "id_number"),
        ("he said he would kill the neighbour", "violence"),
    ],
)
def test_safety_patterns_flag(text, kind):
    assert kind in {f["kind"] for f in safety_flags(text)}


def test_safety_patterns_leave_ordinary_text():
    assert safety_flags("We met at 10:30 on 2024-05-01 and walked 3 km by the river.") == []


def test_safety_llm_reviews_only_flagged():
    model = FakeChatModel(responses=[{"safe": False, "reason": "real threat"}])
    res = context_of(None, models={"chat": model})
    ok, reason, flags = check_safety(res, [{"role": "user", "text": "Lovely weather."}])
    assert ok and not flags and not model.calls
    ok, reason, flags = check_safety(res, [{"role": "user", "text": "I will kill him, I mean it."}])
    assert not ok and "violence" in reason and len(model.calls) == 1
    assert flag_turns([{"role": "user", "text": "mail me at a@b.co"}])[0]["turn"] == 0


def test_future_event_leak_detected():
    past = ["Planning the kitchen renovation budget"]
    future = ["Adopting a greyhound named Comet from the shelter"]
    assert mentions_future("Should I adopt Comet the greyhound?", future, past) == future[0]
    assert mentions_future("How should I split the kitchen budget?", future, past) is None


def test_paraphrase_without_shared_words_found_by_the_bundled_embedder():
    from dualmem.models import load_embeddings

    embedder = load_embeddings("bundled:all-MiniLM-L6-v2")  # a hard dependency: failing to load fails the test
    turns = dialogue(
        "These days my job has me on overnight duty at a storage depot, so mornings feel like evenings.",
        "Forgot to eat at midday because I wanted to complete the jigsaw.",
        "The weather was lovely for a walk.",
        replies=("Sounds like the city is quiet when you get home.", "Jigsaws are absorbing."),
    )
    assert not difficulty_check(turns, FRAGS).ok  # no lexical overlap to speak of ...
    result = difficulty_check(turns, FRAGS, embeddings=embedder)
    assert result.ok, result.reasons  # ... but the meaning matches
    assert result.fragment_turns == [0, 2]
    echoed = dialogue(turns[0]["text"], turns[2]["text"], replies=("Overnight shifts in a warehouse, then.", "Nice."))
    assert not difficulty_check(echoed, FRAGS, embeddings=embedder).ok


INSIGHT = {
    "id": "ins-1",
    "task_type": "Decision Guidance",
    "text": "Late gaming is his way to reclaim time",
    "reasoning_steps": ["a", "b"],
    "fact_kinds": ["work", "leisure"],
}


def test_specificity_needs_all_four_checks():
    from dualmem.generators.weave import check_specificity
    from dualmem.schema import Persona

    persona = Persona(id="p", name="P")
    yes = {"perspective_unique": True, "conversational": True, "needs_fact_combination": True, "testable": True}
    assert check_specificity(context_of(None, models={"chat": FakeChatModel(responses=[yes])}), persona, INSIGHT) == (
        True,
        "",
    )
    ok, reason = check_specificity(
        context_of(None, models={"chat": FakeChatModel(responses=[{**yes, "testable": False, "reason": "vague"}])}),
        persona,
        INSIGHT,
    )
    assert not ok and "testable" in reason and "vague" in reason
    ok, reason = check_specificity(
        context_of(None, models={"chat": FakeChatModel(responses=["not json"])}), persona, INSIGHT
    )
    assert not ok and "invalid after" in reason


def test_necessity_keeps_only_questions_that_need_memory():
    from dualmem.generators.weave import QuerySeed, check_necessity
    from dualmem.schema import Persona

    persona = Persona(id="p", name="P")
    seed = QuerySeed(fragment_1="a", fragment_2="b", question="Should I take the offer?")
    model = FakeChatModel(responses=["Generic advice.", {"needs_memory": True, "reason": "generic"}])
    kept, reason, answer = check_necessity(context_of(None, models={"chat": model}), persona, INSIGHT, seed)
    assert kept and answer == "Generic advice."
    assert "Generic advice." in str(model.calls[1][-1].content)  # the judge sees the no-memory answer
    model = FakeChatModel(responses=["You reclaim time by gaming.", {"needs_memory": False, "reason": "already there"}])
    kept, reason, _ = check_necessity(context_of(None, models={"chat": model}), persona, INSIGHT, seed)
    assert not kept and "without memory" in reason


def test_question_may_not_reuse_the_insight_concepts():
    from dualmem.generators.weave import write_seed
    from dualmem.schema import Persona

    persona = Persona(id="p", name="P")
    base = {"fragment_1": "I play games until 3 am", "fragment_2": "I started night shifts"}
    good = FakeChatModel(responses=[{**base, "question": "Should I take the weekend job?"}])
    seed, reason = write_seed(context_of(None, models={"chat": good}), persona, INSIGHT)
    assert seed is not None and reason == ""
    bad = FakeChatModel(responses=[{**base, "question": "Is late gaming my way to reclaim time?"}])
    seed, reason = write_seed(context_of(None, models={"chat": bad}), persona, INSIGHT)
    assert seed is None and "core concepts" in reason
