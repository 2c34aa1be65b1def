"""Long-history assembly: target token counts, evidence depths and distances, loader round trip."""

from __future__ import annotations

from datetime import datetime

import pytest

from dualmem.datasets import dump_rolememo, load_dataset
from dualmem.generators.assemble import assemble_history, split_woven
from dualmem.models.tokens import count_tokens_batch
from dualmem.schema import Persona

PERSONA = Persona(id="mara", name="Mara Okafor", description="counsellor")


def woven_item(k: int) -> dict:
    turns = []
    for r in range(8):
        user = f"Small talk number {r} about the market and the rain."
        if r == 1:
            user = f"I repainted the {k}th fence panel before breakfast, anyway."
        if r == 6:
            user = f"My cousin returned kayak {k} yesterday, by the way."
        turns += [
            {"role": "user", "text": user},
            {"role": "assistant", "text": "Markets in the rain have their charm."},
        ]
    return {
        "query_id": f"q{k}",
        "insight_id": f"i{k}",
        "question": f"What now, case {k}?",
        "task_type": "Decision Guidance",
        "fragments": [f"I repainted fence panel {k}", f"My cousin returned kayak {k}"],
        "insight": f"insight {k}",
        "turns": turns,
        "fragment_turns": [2, 12],
        "connector": "f1 + f2 -> i -> q",
    }


@pytest.mark.parametrize("target", [2000, 4000])
def test_hits_target_tokens_within_tolerance(target):
    item, stats = assemble_history(PERSONA, [woven_item(k) for k in range(3)], target, seed=1)
    total = sum(count_tokens_batch([t.text for s in item.dialogue.sessions for t in s.turns]))
    assert stats["total_tokens"] == total
    assert abs(total - target) <= 0.05 * target
    assert stats["within_tolerance"]
    assert stats["filler_sessions"] >= 1 and stats["queries"] == 3


def test_evidence_depths_distance_and_dates():
    item, stats = assemble_history(PERSONA, [woven_item(k) for k in range(3)], 4000, seed=2, fragment_distance=2)
    sessions = item.dialogue.sessions
    assert len(stats["evidence"]) == 6  # every evidence position: session, turn, depth
    assert {(e["session_id"], e["turn_id"]) for e in stats["evidence"]} == {
        (e["session_id"], e["turn_id"]) for q in item.queries for e in q.meta["evidence"]
    }
    index = {s.id: i for i, s in enumerate(sessions)}
    turn_ids = {t.id for s in sessions for t in s.turns}
    firsts = []
    for q in item.queries:
        ev = q.meta["evidence"]
        assert len(ev) == 2 and all(e["turn_id"] in turn_ids for e in ev)
        assert ev[0]["session_id"] != ev[1]["session_id"]  # the two fragments land in different sessions
        gap = index[ev[1]["session_id"]] - index[ev[0]["session_id"]] - 1
        assert gap == q.meta["fragment_distance_sessions"] == 2
        # the recorded turn really carries the fragment's text
        text = next(t.text for s in sessions for t in s.turns if t.id == ev[0]["turn_id"])
        assert "fence panel" in text
        depths = q.meta["evidence_depths"]
        assert 0 <= depths[0] < depths[1] <= 1
        firsts.append((q.meta["depth_slot"], depths[0]))
    slots = dict(firsts)
    assert list(slots) == ["beginning", "middle", "end"]
    assert slots["beginning"] < slots["middle"] < slots["end"]
    assert slots["beginning"] < 0.35 and slots["end"] > 0.6
    times = [datetime.fromisoformat(s.time) for s in sessions]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert all(q.time > sessions[-1].time for q in item.queries)


def test_deterministic_and_seed_sensitive():
    a, _ = assemble_history(PERSONA, [woven_item(0)], 2000, seed=3)
    b, _ = assemble_history(PERSONA, [woven_item(0)], 2000, seed=3)
    c, _ = assemble_history(PERSONA, [woven_item(0)], 2000, seed=4)
    assert a.model_dump() == b.model_dump()
    assert [t.text for s in a.dialogue.sessions for t in s.turns] != [
        t.text for s in c.dialogue.sessions for t in s.turns
    ]


def test_too_small_target_drops_queries_and_says_so():
    item, stats = assemble_history(PERSONA, [woven_item(k) for k in range(5)], 600, seed=0)
    assert stats["dropped"] and len(item.queries) == 5 - len(stats["dropped"])


def test_split_keeps_fragments_apart_and_distance_zero_keeps_one_session():
    turns = woven_item(0)["turns"]
    parts = split_woven(turns, [2, 12], 1)
    assert len(parts) == 2 and 2 in parts[0] and 12 in parts[1] and turns[parts[1][0]]["role"] == "user"
    assert split_woven(turns, [2, 12], 0) == [list(range(len(turns)))]
    item, _ = assemble_history(PERSONA, [woven_item(0)], 2000, fragment_distance=0)
    ev = item.queries[0].meta["evidence"]
    assert ev[0]["session_id"] == ev[1]["session_id"]


def test_output_loads_with_rolememo_loader(tmp_path):
    item, _ = assemble_history(PERSONA, [woven_item(k) for k in range(2)], 2000, seed=5)
    path = dump_rolememo(item, tmp_path / "mara.json")
    ds = load_dataset("rolememo", path)
    loaded = ds.items[0]
    assert [q.id for q in loaded.queries] == ["q0", "q1"]
    assert loaded.queries[0].gold.facts == item.queries[0].gold.facts
    assert loaded.queries[0].gold.turn_ids == item.queries[0].gold.turn_ids
    assert loaded.queries[0].meta["evidence_depths"] == item.queries[0].meta["evidence_depths"]
    assert sum(s.filler for s in loaded.dialogue.sessions) >= 1
