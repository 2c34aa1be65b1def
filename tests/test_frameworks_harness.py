"""Every registered framework runs through the evaluation harness on a three-session fixture."""

from __future__ import annotations

import json

import pytest

from dualmem.config import Settings
from dualmem.datasets import dump_rolememo, load_sample
from dualmem.frameworks import available, framework_class
from dualmem.testing import make_fake


def settings_embedder(settings: Settings):
    from dualmem.models import load_embeddings

    return load_embeddings(settings.embedder)


@pytest.fixture(scope="module")
def three_sessions(tmp_path_factory):
    item = load_sample()
    short = item.model_copy(
        update={"dialogue": item.dialogue.model_copy(update={"sessions": item.dialogue.sessions[:3]})}
    )
    # keep only queries whose evidence lies in those three sessions, so the file stays valid
    kept = {s.id for s in short.dialogue.sessions}
    short.queries = [q for q in item.queries if set(q.gold.session_ids) <= kept] or item.queries[:1]
    if not set(short.queries[0].gold.session_ids) <= kept:
        short = item  # the sample's evidence needs all sessions: fall back to the full sample
    path = tmp_path_factory.mktemp("fixture") / "three.json"
    dump_rolememo(short, path)
    return path, short


def test_every_framework_is_listed_with_a_description():
    names = available()
    assert {
        "dualmem",
        "full-context",
        "raw-turns",
        "mem0-classic",
        "langmem",
        "memagent",
        "memorybank",
        "amem",
        "emotional-rag",
        "bookmarks",
    } <= set(names)
    for name in names:
        assert framework_class(name).description.strip()


@pytest.mark.parametrize("name", available())
def test_framework_runs_through_the_harness(name, three_sessions, tmp_path):
    from dualmem.evaluate import run_eval

    path, item = three_sessions
    settings = Settings(
        chat_model="fake:memory",
        embedder="hash:64",
        store_uri=str(tmp_path / "db"),
        checkpoint_path=str(tmp_path / "ck.sqlite"),
        chunk_tokens=256,
        max_retries=1,
    )
    out = run_eval(
        "rolememo",
        path,
        name,
        settings=settings,
        model=make_fake("memory"),
        out=tmp_path / "run",
        progress=False,
        ragas=False,
    )
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    assert records, f"{name}: no per-query records"
    assert all(r.get("answer") is not None or r.get("errors") for r in records), (
        f"{name}: every query answered or its error recorded"
    )
    assert (out / "report.html").exists() and summary
    # every session went in, cleanly, and left something in the framework's memory
    ingest = summary["ingest"]
    assert ingest["sessions"] == len(item.dialogue.sessions), f"{name}: {ingest}"
    assert ingest["failed_chunks"] == 0 and not ingest["failed_sessions"] and not ingest["errors"], f"{name}: {ingest}"
    assert ingest["items_written"] > 0, f"{name}: nothing written"
    # reopen the framework on the run's store, as a later process would: the memory is there and from these sessions
    from dualmem.evals.unit import persona_store
    from dualmem.frameworks import FrameworkContext, open_framework

    reopened = open_framework(
        name,
        FrameworkContext(
            namespace=(item.dialogue.id, item.dialogue.user_id or settings.user_id),
            settings=settings,
            persona=item.dialogue.persona,
            chat_model=make_fake("memory"),
            embeddings=settings_embedder(settings),
            store_uri=persona_store(settings.store_uri, item),
        ),
    )
    items = reopened.retrieve(item.queries[0].text, k=10)
    assert items and all(it.text.strip() for it in items), f"{name}: nothing retrievable after the run"
    ingested = {s.id for s in item.dialogue.sessions}
    assert {sid for it in items for sid in it.sessions()} <= ingested, f"{name}: retrieved sessions never ingested"
    words = {
        w.lower().strip(".,!?") for s in item.dialogue.sessions for t in s.turns for w in t.text.split() if len(w) > 5
    }
    assert any(w in words for it in items for w in (x.lower().strip(".,!?") for x in it.text.split())), (
        f"{name}: retrieved text shares nothing with the dialogue"
    )
    # the same session again, from a fresh instance (a resumed run in a new process): the framework's own
    # ledger skips it — no model call, nothing added
    model = make_fake("memory")
    again = open_framework(
        name,
        FrameworkContext(
            namespace=(item.dialogue.id, item.dialogue.user_id or settings.user_id),
            settings=settings,
            persona=item.dialogue.persona,
            chat_model=model,
            writer_model=model,
            embeddings=settings_embedder(settings),
            store_uri=persona_store(settings.store_uri, item),
        ),
    )
    before = {(it.id, it.text) for it in again.retrieve(item.queries[0].text, k=50)}
    asked = len(model.calls)  # some frameworks ask the model at retrieval (query emotion, bookmarks)
    report = again.ingest(item.dialogue.sessions[0])
    assert len(model.calls) == asked, (
        f"{name}: re-ingesting an ingested session called the model {len(model.calls) - asked} times"
    )
    assert report.items_written == 0 and not report.failed_chunks, f"{name}: {report}"
    assert {(it.id, it.text) for it in again.retrieve(item.queries[0].text, k=50)} == before, f"{name}: memory changed"
