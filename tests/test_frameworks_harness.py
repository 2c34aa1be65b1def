"""Every registered framework runs through the evaluation harness on a three-session fixture."""

from __future__ import annotations

import json

import pytest

from dualmem.config import Settings
from dualmem.datasets import dump_rolememo, load_sample
from dualmem.frameworks import available, framework_class
from dualmem.testing import make_fake


@pytest.fixture(scope="module")
def three_sessions(tmp_path_factory):
    item = load_sample()
    short = item.model_copy(update={"dialogue": item.dialogue.model_copy(update={"sessions": item.dialogue.sessions[:3]})})
    # keep only queries whose evidence lies in those three sessions, so the file stays valid
    kept = {s.id for s in short.dialogue.sessions}
    short.queries = [q for q in item.queries if set(q.gold.session_ids) <= kept] or item.queries[:1]
    if not set(short.queries[0].gold.session_ids) <= kept:
        short = item  # the sample's evidence needs all sessions: fall back to the full sample
    path = tmp_path_factory.mktemp("fixture") / "three.json"
    dump_rolememo(short, path)
    return path, len(short.dialogue.sessions)


def test_every_framework_is_listed_with_a_description():
    names = available()
    assert {"dualmem", "full-context", "raw-turns", "mem0-classic", "langmem", "memagent", "memorybank", "amem", "emotional-rag", "bookmarks"} <= set(names)
    for name in names:
        assert framework_class(name).description.strip()


@pytest.mark.parametrize("name", available())
def test_framework_runs_through_the_harness(name, three_sessions, tmp_path):
    from dualmem.evals.run import run_eval

    path, _sessions = three_sessions
    settings = Settings(
        chat_model="fake:memory", embedder="hash:64", store_uri=str(tmp_path / "db"),
        checkpoint_path=str(tmp_path / "ck.sqlite"), chunk_tokens=256, max_retries=1,
    )
    out = run_eval("rolememo", path, name, settings=settings, model=make_fake("memory"), out=tmp_path / "run", progress=False, ragas=False)
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    assert records, f"{name}: no per-query records"
    assert all(r.get("answer") is not None or r.get("errors") for r in records), f"{name}: every query answered or its error recorded"
    assert (out / "report.html").exists() and summary
