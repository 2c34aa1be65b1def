"""Metric functions on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from dualmem.evals import metrics as m

# a tiny embedder with hand-chosen vectors: cosines are computable by hand
VECS = {
    "a": [1.0, 0.0, 0.0],
    "a-ish": [0.8, 0.6, 0.0],  # cos(a, a-ish) = 0.8
    "b": [0.0, 1.0, 0.0],
    "mid": [0.62, 0.0, 0.7846],  # cos(a, mid) ~ 0.62 (fact hit, insight miss)
    "c": [0.0, 0.0, 1.0],
}


def embed(texts):
    return [VECS[t] for t in texts]


def test_rolememo_recall_thresholds_and_top_k():
    out = m.rolememo_recall(["a", "b"], "a", ["mid", "c"], embed, k=10)
    assert out["fact_similarities"][0] == pytest.approx(0.62, abs=1e-3)
    assert out["fact_hits"] == [True, False]  # 0.62 >= 0.60; b is orthogonal to both
    assert out["insight_similarity"] == pytest.approx(0.62, abs=1e-3)
    assert out["insight_hit"] is False  # 0.62 < 0.65
    assert out["fact_recall"] == 0.5
    # the same gold with its exact match ranked past k is a miss
    cut = m.rolememo_recall(["a"], None, ["c", "a"], embed, k=1)
    assert cut["fact_hits"] == [False] and cut["insight_total"] == 0
    assert math.isnan(cut["insight_recall"])


def test_aggregate_rolememo_micro_averages_over_gold_items():
    q1 = m.rolememo_recall(["a", "b", "c"], "a", ["a"], embed)  # facts 1/3, insight 1/1
    q2 = m.rolememo_recall(["b"], "c", ["b"], embed)  # facts 1/1, insight 0/1
    agg = m.aggregate_rolememo([q1, q2], ["Value Judgment", "Decision Guidance"])
    assert agg["overall"]["fact_recall@10"] == pytest.approx(2 / 4)  # micro, not (1/3+1)/2
    assert agg["overall"]["insight_recall@10"] == pytest.approx(1 / 2)
    assert agg["by_task_type"]["Decision Guidance"]["insight_recall@10"] == 0.0
    assert agg["by_task_type"]["Value Judgment"]["fact_recall@10"] == pytest.approx(1 / 3)


def test_realmem_metrics_hand_computed():
    # gold {s1, s3}; ranked s2, s1, s2(dup), s3 -> deduped s2, s1, s3
    out = m.realmem_session_metrics(["s2", "s1", "s2", "s3"], ["s1", "s3"], ks=(1, 2, 5))
    assert out["recall_any@1"] == 0.0 and out["recall_any@2"] == 1.0
    assert out["recall_all@2"] == 0.0 and out["recall_all@5"] == 1.0
    # DCG@5 = 0 + 1/log2(2) + 1/log2(3); IDCG = 1 + 1/log2(2) = 2
    assert out["ndcg_any@5"] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    # positions 1 and 2 weigh the same: gold at rank 2 alone scores like rank 1
    assert m.realmem_session_metrics(["x", "g"], ["g"], ks=(5,))["ndcg_any@5"] == 1.0
    assert m.realmem_session_metrics(["x", "y", "g"], ["g"], ks=(5,))["ndcg_any@5"] == pytest.approx(1 / math.log2(3))
    assert m.realmem_session_metrics(["x"], [], ks=(5,)) == {}


def test_dcg_matches_realmem_formula():
    assert m.dcg([1, 0, 1, 1], 10) == pytest.approx(1 + 1 / math.log2(3) + 1 / math.log2(4))
    assert m.dcg([1, 1, 1], 2) == 2.0
    assert m.dcg([], 5) == 0.0


def test_macro_average_is_unweighted_over_personas():
    per = {"p1": {"recall_any@5": 1.0}, "p2": {"recall_any@5": 0.0}, "p3": {"recall_any@5": 0.5}}
    assert m.macro_average(per) == {"recall_any@5": pytest.approx(0.5)}
    assert m.average_metrics([{"x": 1.0}, {"x": float("nan")}, {}]) == {"x": 1.0}


def test_memory_point_recall():
    out = m.memory_point_recall(["a", "b"], ["a-ish", "c"], embed, threshold=0.7)  # a: 0.8, b: 0.6
    assert out["memory_point_hits"] == [True, False]
    assert out["memory_point_recall"] == 0.5


def test_locomo_evidence_recall():
    assert m.locomo_evidence_recall(["D1:3", "D2:1", "D1:3", "D1:4"], ["D1:3", "D1:4"], k=2) == 0.5
    assert m.locomo_evidence_recall(["D1:3", "D2:1", "D1:3", "D1:4"], ["D1:3", "D1:4"], k=3) == 1.0
    assert math.isnan(m.locomo_evidence_recall(["D1:1"], [], k=5))


def test_aggregate_by_category():
    recs = [
        {"category": "1", "metrics": {"r@5": 1.0}},
        {"category": "1", "metrics": {"r@5": 0.0}},
        {"category": "5", "metrics": {"r@5": 1.0}},
    ]
    assert m.aggregate_by(recs, "category") == {"1": {"r@5": 0.5}, "5": {"r@5": 1.0}}


def test_ragas_id_scores_definitions():
    s = m.ragas_id_scores(["a", "b", "c", "a"], ["a", "d"])
    assert s["id_context_recall"] == 0.5  # a of {a, d}
    assert s["id_context_precision"] == pytest.approx(1 / 3)  # a of {a, b, c}
    assert math.isnan(m.ragas_id_scores([], ["a"])["id_context_precision"])


def test_ragas_agrees_with_our_definitions():
    assert m.ragas_available(), "ragas (a pinned dependency) must import offline: its ID metrics are cross-checked here"
    pairs = [(["a", "b", "c", "a"], ["a", "d"]), ([], ["a"]), (["x"], ["x"])]
    theirs = m.ragas_id_scores_batch(pairs)
    assert theirs[0] == {"id_context_recall": 0.5, "id_context_precision": pytest.approx(1 / 3)}
    for a, b in zip(theirs, [m.ragas_id_scores(*p) for p in pairs], strict=True):
        for k in a:
            assert (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == pytest.approx(b[k])
