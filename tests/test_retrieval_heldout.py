"""The held-out protocol of the learned ranker: no persona's or conversation's queries fit the weights that score it.

Real RealMem (Sophie, a prefix) and LoCoMo (two conversations, a prefix of
their questions) examples, built as ``dualmem eval`` asks them, in real
LanceDB stores (hash embeddings: the protocol is under test, not the figures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import LOCOMO, REALMEM_SOPHIE, REPO, need

from dualmem.config import Settings
from dualmem.frameworks.base import FrameworkContext
from dualmem.retrieval import fit as fitting
from dualmem.retrieval.weights import RankerWeights
from dualmem.testing import HashEmbeddings

FOLDS = REPO / "benchmarks" / "results" / "rankers"
RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    from dualmem.datasets import load_locomo, load_realmem
    from dualmem.evals.ranker_examples import store_examples

    root = tmp_path_factory.mktemp("heldout")
    sophie = load_realmem(need(REALMEM_SOPHIE)).items[0]
    sessions = sophie.dialogue.sessions[:30]
    kept = {s.id for s in sessions}
    sophie = sophie.model_copy(
        update={
            "dialogue": sophie.dialogue.model_copy(update={"sessions": sessions}),
            "queries": [q for q in sophie.queries if q.session_id in kept],
        }
    )
    convs = [it.model_copy(update={"queries": it.queries[:30]}) for it in load_locomo(need(LOCOMO)).items[:2]]
    emb = HashEmbeddings(64)

    def ctx(item):
        return FrameworkContext(
            namespace=(item.dialogue.id, "user"),
            settings=Settings(store_uri=str(root / item.dialogue.id)),
            embeddings=emb,
        )

    out, examples = [], {}
    for kind, items in (("realmem", [sophie]), ("locomo", convs)):
        for store, exs in store_examples(kind, items, ctx):
            examples[exs[0].group] = (
                sophie if kind == "realmem" else next(c for c in convs if c.dialogue.id == exs[0].group),
                exs,
            )
            out += fitting.collect(store, exs, kinds=("fact",))
    return out, examples


def test_realmem_examples_see_only_earlier_sessions_with_their_own_session_as_context(collected):
    _, examples = collected
    item, exs = examples["Sophie_Dubois"]
    order = [s.id for s in item.dialogue.sessions]
    assert exs
    for ex in exs:
        q = next(q for q in item.queries if q.id == ex.id)
        visible = ex.filter["session_id"]["$in"]
        assert visible == order[: order.index(q.session_id)]  # the sessions before the query's, none after
        own = next(s for s in item.dialogue.sessions if s.id == q.session_id)
        assert list(ex.context) == own.turns[: q.turn_index or 0]
        assert set(ex.relevant_sessions) == set(q.gold.session_ids)


def test_locomo_examples_label_the_evidence_turns_and_score_categories_1_to_4(collected):
    data, examples = collected
    item, exs = examples["conv-26"]
    assert {ex.meta["category"] for ex in exs} <= {"1", "2", "3", "4"} and exs
    labelled = [c for c in data if c.group == "conv-26"]
    assert all(c.y.sum() >= 1 and c.unit == "item" for c in labelled)


def test_no_group_fits_the_weights_that_score_it(collected, monkeypatch):
    data, _ = collected
    seen: list[set[str]] = []
    real_fit = fitting.fit

    def spy(rows, **kwargs):
        seen.append({c.group for c in rows})
        return real_fit(rows, **kwargs)

    monkeypatch.setattr(fitting, "fit", spy)
    groups = sorted({c.group for c in data})
    folds = fitting.leave_one_group_out(data, policies=((0, 0), (1, 0)))
    assert sorted(folds) == groups == ["Sophie_Dubois", "conv-26", "conv-30"]
    assert seen == [set(groups) - {g} for g in groups]  # each fold fitted on the other groups, all of them
    for group, weights in folds.items():
        assert weights.meta["held_out"] == group and group not in weights.meta["groups"]
    scored = fitting.group_means(data, lambda g: folds[g])
    assert set(scored) == set(groups) and all(0.0 <= fitting.primary(m) <= 1.0 for m in scored.values())


def test_the_committed_fold_weights_each_leave_their_group_out():
    files = sorted(FOLDS.glob("*.json"))
    assert len(files) == 19, (
        "benchmarks/results/rankers/ holds one weights file per RealMem persona and LoCoMo conversation"
    )
    groups = {f.stem for f in files}
    for path in files:
        weights = RankerWeights.from_json(json.loads(path.read_text()))
        assert weights.meta["held_out"] == path.stem
        assert set(weights.meta["groups"]) == groups - {path.stem}  # fitted on every other group, never its own


def test_the_held_out_runs_rank_each_persona_with_its_own_fold(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from _retrieval_runs import held_out_factory

    from dualmem.evals.unit import UnitEnv
    from dualmem.schema import DatasetItem, Dialogue

    paths = {g: FOLDS / f"{g}.json" for g in ("Sophie_Dubois", "conv-26")}
    factory = held_out_factory(paths)
    env = UnitEnv(
        settings=Settings(store_uri=str(tmp_path), embedder="hash:32"), records={}, stores={"raw-turns": str(tmp_path)}
    )
    for group, path in paths.items():  # as a run calls it: factory(name, item, the run's UnitEnv)
        framework = factory("raw-turns", DatasetItem(dialogue=Dialogue(id=group, sessions=[])), env)
        assert Path(framework.ranker.spec) == path


@pytest.mark.parametrize(
    ("name", "keys"),
    [("realmem_retrieval.json", ("ndcg_any@10", "recall_any@10")), ("locomo_retrieval.json", ("recall@10",))],
)
def test_results_files_hold_the_held_out_figures(name, keys):
    results = json.loads((RESULTS / name).read_text())
    held = results["held_out"]
    assert all(0.0 < held[k] <= 1.0 for k in keys)
    assert results["variants"]["learned"]["in_sample"] is True  # the shipped weights' figures are labelled in-sample
