"""Judges through `langsmith.evaluate`: offline by default, and uploaded (dataset, experiment, runs, feedback) to a
stand-in endpoint — same scores."""

from __future__ import annotations

import hashlib

import pytest
from fixtures.langsmith_standin import LangSmithStandin

from dualmem.config import Settings
from dualmem.datasets import dump_rolememo, load_sample
from dualmem.evals.fakes import TurnLogFramework
from dualmem.evals.reports import read_records, read_summary
from dualmem.evaluate import run_eval
from dualmem.frameworks import FrameworkContext
from dualmem.schema import Dataset
from dualmem.testing import FakeChatModel, HashEmbeddings


def _score(messages) -> dict:
    """A judge whose verdict depends only on what it reads (so order and concurrency cannot change it)."""
    digest = hashlib.sha256(str(messages[-1].content).encode()).digest()
    return {"reasoning": "scripted", "score": digest[0] % 6}


@pytest.fixture
def data(tmp_path):
    base = load_sample()
    items = []
    for name in ("ana", "ben"):
        item = base.model_copy(deep=True)
        item.dialogue.id = name
        items.append(item)
    return dump_rolememo(Dataset(name="rolememo", items=items), tmp_path / "data")


def _run(data, out, **kwargs):
    def factory(name, item, ctx):
        return TurnLogFramework(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical")

    return run_eval(
        "rolememo",
        data,
        "turn-log",
        out=out,
        settings=Settings(embedder="hash:64", judge_repetitions=2),
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        progress=False,
        ragas=False,
        judge=FakeChatModel(responses=[_score], cycle=True),
        **kwargs,
    )


def _scores(run_dir):
    return {
        (r["persona"], r["query_id"], k): v["score"]
        for r in read_records(run_dir / "records.jsonl")
        for k, v in r["judges"].items()
    }


def test_offline_and_uploaded_runs_give_the_same_scores_and_the_upload_holds_them(data, tmp_path, monkeypatch):
    monkeypatch.delenv("LANGSMITH_API_KEY", raising=False)
    monkeypatch.delenv("LANGCHAIN_API_KEY", raising=False)
    offline = _run(data, tmp_path / "offline")
    assert read_summary(offline)["meta"]["langsmith"]["mode"] == "offline (upload_results=False)"
    scores = _scores(offline)
    assert len(scores) == 2 * 3 * 4 and len(set(scores.values())) > 1  # 2 personas x 3 queries x 4 judges, varied

    with LangSmithStandin() as server:
        monkeypatch.setenv("LANGSMITH_ENDPOINT", server.url)
        monkeypatch.setenv("LANGSMITH_API_KEY", "test-key")
        uploaded = _run(data, tmp_path / "uploaded")  # a key is set: upload by default
    assert _scores(uploaded) == scores
    meta = read_summary(uploaded)["meta"]["langsmith"]
    assert meta["mode"] == "uploaded" and meta["dataset"] == "dualmem-rolememo-data"
    assert not server.unknown, f"requests the stand-in does not serve: {server.unknown}"

    [dataset] = server.datasets.values()
    assert dataset["name"] == "dualmem-rolememo-data" and dataset["example_count"] == 6
    assert {e["inputs"]["query_id"] for e in server.examples.values()} == {q for _, q, _ in scores}
    [experiment] = server.sessions.values()
    assert experiment["reference_dataset_id"] == dataset["id"] and meta["experiment"] == "dualmem-uploaded"
    targets = [r for r in server.runs.values() if r.get("reference_example_id")]
    assert sorted(r["reference_example_id"] for r in targets) == sorted(server.examples)  # one run per example
    answers = {(r["inputs"]["persona_id"], r["inputs"]["query_id"]): r["outputs"]["answer"] for r in targets}
    records = {(r["persona"], r["query_id"]): r for r in read_records(uploaded / "records.jsonl")}
    assert answers == {k: r["answer"] for k, r in records.items()}
    by_run = {r["id"]: (r["inputs"]["persona_id"], r["inputs"]["query_id"]) for r in targets}
    feedback = {(*by_run[f["run_id"]], f["key"]): f["score"] for f in server.feedback if f.get("run_id") in by_run}
    assert feedback == scores  # every verdict uploaded as feedback on its example's run, with the same score
