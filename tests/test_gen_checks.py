"""Generator checks on hand-made passing and failing cases: difficulty, safety, time firewall."""

from __future__ import annotations

import pytest

from dualmem.nodes.checks import difficulty_check, flag_turns, fragment_overlap, mentions_future, safety_flags, units
from dualmem.nodes.weave_steps import GenResources, check_safety
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
    turns = dialogue("I work night shifts at the warehouse.", "As I said, night shifts at the warehouse again.", "I skipped lunch to finish a puzzle.")
    result = difficulty_check(turns, FRAGS)
    assert not result.ok
    assert "expected exactly one" in " ".join(result.reasons)


def test_thresholds_are_parameters():
    turns = dialogue("Night work lately.", "I skipped lunch to finish a puzzle.")
    assert not difficulty_check(turns, FRAGS).ok
    assert difficulty_check(turns, FRAGS, overlap_threshold=0.3).ok


def test_chinese_dialogue_by_character_ngrams():
    frags = ["我在仓库上夜班", "我为了拼完拼图没吃午饭"]
    turns = dialogue("今天天气有点冷。", "最近一直在仓库上夜班，早上才睡觉。", "周末打算去看展览。", "昨天为了拼完拼图，午饭都没吃。")
    assert units("仓库")
    result = difficulty_check(turns, frags)
    assert result.ok, result.reasons
    echoed = dialogue("最近一直在仓库上夜班。", "昨天为了拼完拼图，午饭都没吃。", replies=("你在仓库上夜班啊，辛苦了。", "好的。"))
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
    res = GenResources(model=model)
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
