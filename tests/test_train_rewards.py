"""Reward values on hand-made memories, the judge weighting, and VeRL's compute_score."""

from __future__ import annotations

import inspect
import json

import pytest
from fixtures.train_data import make_item

from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.training.episode import build_episode
from dualmem.training.rewards import (
    JudgeScores,
    RewardConfig,
    compute_score,
    dense_reward,
    episode_reward,
    judge_weighted,
)
from dualmem.training.writing import parse_updates

EMBED = HashEmbeddings(dims=256)
CFG = RewardConfig(embedder="hash:256")


@pytest.fixture
def gt():
    return build_episode(make_item(), chunk_tokens=60).ground_truth()


def test_full_recall_is_high_and_empty_memory_is_zero(gt):
    full = dense_reward(gt["facts"] + gt["insights"], gt, cfg=CFG, embed=EMBED)
    assert full.score == pytest.approx(1.0) and full.fact_recall == 1.0 and full.insight_recall == 1.0
    empty = dense_reward([], gt, cfg=CFG, embed=EMBED)
    assert empty.score == 0.0 and empty.fact_recall == 0.0


def test_partial_recall_sits_between(gt):
    half = dense_reward(gt["facts"][:2], gt, cfg=CFG, embed=EMBED)
    assert half.fact_recall == pytest.approx(0.5) and half.insight_recall == 0.0
    assert 0.0 < half.score < 1.0


def test_penalties_for_dangling_invalid_unparseable_and_bloat(gt):
    memory = gt["facts"] + gt["insights"]
    base = dense_reward(memory, gt, cfg=CFG, embed=EMBED).score
    assert dense_reward(memory, gt, dangling=2, cfg=CFG, embed=EMBED).score == pytest.approx(
        base - 2 * CFG.dangling_penalty
    )
    assert dense_reward(memory, gt, invalid=1, cfg=CFG, embed=EMBED).score == pytest.approx(base - CFG.invalid_penalty)
    assert dense_reward(memory, gt, unparseable=1, cfg=CFG, embed=EMBED).score == pytest.approx(
        base - CFG.unparseable_penalty
    )
    bloated = memory + [f"unrelated filler note number {i}" for i in range(CFG.memory_budget + 10 - len(memory))]
    out = dense_reward(bloated, gt, cfg=CFG, embed=EMBED)
    assert out.penalty == pytest.approx(10 * CFG.bloat_penalty) and out.score < base


def test_judge_weights_30_60_10():
    assert judge_weighted(JudgeScores(factual_utility=10, logic_persona=0, value_safety=0)) == pytest.approx(0.3)
    assert judge_weighted(JudgeScores(factual_utility=0, logic_persona=10, value_safety=0)) == pytest.approx(0.6)
    assert judge_weighted(JudgeScores(factual_utility=10, logic_persona=10, value_safety=10)) == pytest.approx(1.0)


def test_episode_reward_adds_the_weighted_judge(gt):
    answers = [
        "I think you are exhausted, not lazy.",
        JudgeScores(factual_utility=5, logic_persona=10, value_safety=10),
    ]
    judge = FakeChatModel(responses=answers * len(gt["queries"]), cycle=True)
    cfg = RewardConfig(embedder="hash:256", dense_weight=0.5, judge_weight=0.5)
    out = episode_reward(gt["facts"] + gt["insights"], gt, cfg=cfg, embed=EMBED, judge=judge)
    assert out.judge == pytest.approx(0.85)
    assert out.score == pytest.approx(0.5 * 1.0 + 0.5 * 0.85)
    # the judge saw the persona's answer, built from the written memory
    assert any(gt["insights"][0] in str(m.content) for call in judge.calls for m in call)


def test_unparseable_judge_is_recorded_not_silently_zero(gt):
    judge = FakeChatModel(responses=["an answer", "no json here"], cycle=False)
    cfg = RewardConfig(embedder="hash:256", judge_weight=1.0)
    out = episode_reward(gt["facts"], gt, cfg=cfg, embed=EMBED, judge=judge)
    assert out.judge is None and out.judge_error


def test_parse_updates_counts_bad_objects():
    ups, bad = parse_updates('{"facts": [], "insights": []} junk {"facts": "x"}')
    assert len(ups) == 1 and bad == 1
    assert parse_updates("nothing") == ([], 1)


def test_a_parse_failure_costs_its_share_without_erasing_the_rest(gt):
    memory = gt["facts"][:2]
    clean = dense_reward(memory, gt, turns=4, cfg=CFG, embed=EMBED)
    one_bad = dense_reward(memory, gt, turns=4, unparseable=1, cfg=CFG, embed=EMBED)
    all_bad = dense_reward([], gt, turns=4, unparseable=4, cfg=CFG, embed=EMBED)
    assert clean.score > one_bad.score > 0.0 > all_bad.score  # the recall of the turns that parsed still counts
    assert one_bad.penalty == pytest.approx(CFG.unparseable_penalty / 4) and one_bad.parsed_share == 0.75
    assert one_bad.score == pytest.approx(clean.score - CFG.format_weight * 0.25 - CFG.unparseable_penalty / 4)


def test_weak_policies_get_spread_within_a_group(gt):
    """Rollouts of a weak policy recall no gold item, yet their rewards differ: near misses, parse rate."""
    near = [gt["facts"][0].split(" at ")[0], "user mentioned work"]
    group = [
        dense_reward([], gt, turns=3, unparseable=3, cfg=CFG, embed=EMBED),
        dense_reward(["the weather is grey"], gt, turns=3, unparseable=2, cfg=CFG, embed=EMBED),
        dense_reward(["the weather is grey"], gt, turns=3, unparseable=1, cfg=CFG, embed=EMBED),
        dense_reward(near, gt, turns=3, unparseable=1, cfg=CFG, embed=EMBED),
    ]
    scores = [r.score for r in group]
    assert len(set(scores)) == 4 and scores == sorted(scores), scores
    assert all(not r.fact_recall or r.fact_recall < 0.5 for r in group)


def test_penalties_and_weights_are_configurable(gt):
    strict = RewardConfig(embedder="hash:256", unparseable_penalty=1.0, similarity_weight=0.0, format_weight=0.0)
    out = dense_reward(gt["facts"], gt, turns=2, unparseable=1, cfg=strict, embed=EMBED)
    assert out.penalty == pytest.approx(0.5) and out.score == pytest.approx(0.5 * 1.0 + 0.5 * 0.0 - 0.5)
    assert RewardConfig.from_dict({"unparseable_penalty": 0.2}).unparseable_penalty == 0.2


def test_compute_score_signature_and_values(gt):
    assert list(inspect.signature(compute_score).parameters) == [
        "data_source",
        "solution_str",
        "ground_truth",
        "extra_info",
    ]
    extra = {"reward_config": {"embedder": "hash:256"}}
    good = json.dumps(
        {
            "facts": [{"op": "ADD", "id": f"N{i}", "text": t} for i, t in enumerate(gt["facts"], 1)],
            "insights": [
                {"op": "ADD", "id": f"M{i}", "text": t, "fact_ids": ["N1"]} for i, t in enumerate(gt["insights"], 1)
            ],
        }
    )
    high = compute_score("dualmem", good, json.dumps(gt), extra)
    assert high["score"] == pytest.approx(1.0) and all(isinstance(v, float) for v in high.values())
    garbage = compute_score("dualmem", "garbage", gt, extra)
    assert garbage["score"] == pytest.approx(-CFG.unparseable_penalty) and garbage["parsed_share"] == 0.0
    dangling = json.dumps(
        {
            "facts": [{"op": "ADD", "id": "N1", "text": gt["facts"][0]}],
            "insights": [{"op": "ADD", "id": "M1", "text": gt["insights"][0], "fact_ids": ["N1", "F7"]}],
        }
    )
    clean = dangling.replace(', "F7"', "")
    assert compute_score("dualmem", dangling, gt, extra)["score"] < compute_score("dualmem", clean, gt, extra)["score"]
    replayed = compute_score("dualmem", "", gt, {**extra, "memory": gt["facts"], "dangling": 1})
    assert replayed["fact_recall"] == 1.0 and replayed["penalty"] == pytest.approx(CFG.dangling_penalty)


def test_top_memory_ranks_by_similarity():
    from dualmem.training.rewards import top_memory

    memory = [f"unrelated note {i} about gardening" for i in range(12)] + ["works night shifts at the warehouse"]
    top = top_memory("night shifts warehouse", memory, EMBED, k=3)
    assert top[0] == "works night shifts at the warehouse" and len(top) == 3
