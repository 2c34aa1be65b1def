"""SFT export from RoleMemo gold and teacher traces: the product's prompts and views, targets valid, split by persona."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from fixtures.train_data import make_dataset, make_item

from dualmem.config import Settings
from dualmem.errors import DatasetError
from dualmem.memory.view import view_ids, view_text
from dualmem.prompts.writer import render_writer_messages
from dualmem.schema import MemoryUpdate
from dualmem.stores.memory import InMemoryDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.training.episode import build_episode, gold_steps
from dualmem.training.export import (
    export_sft,
    gold_records,
    llamafactory_info,
    load_traces,
    split_by_persona,
    validate_record,
)
from dualmem.training.targets import about_user
from dualmem.training.writing import EpisodeMemory, writer_context
from dualmem.writer.core import recall_view, write_chunk
from dualmem.writer.history import write_history

CTX = writer_context(embedder=HashEmbeddings(64))


def test_gold_steps_add_fragments_where_they_appear_and_the_insight_once_both_are_seen():
    item = make_item()
    ep = build_episode(item, chunk_tokens=60)
    steps = gold_steps(ep, CTX)
    assert len(steps) == len(ep.chunks) > 4
    writes = [(s.index, s.target) for s in steps if s.target.facts or s.target.insights]
    first_q = item.queries[0]
    add_chunks = {f.text: n for n, t in writes for f in t.facts}
    # fact targets are sentences about the user (the writer prompt's convention), not the user's own words
    assert set(add_chunks) == {about_user(f) for q in item.queries for f in q.gold.facts}
    assert "The user works night shifts at the warehouse these days." in add_chunks
    assert "The user skipped their sister's birthday dinner again." in add_chunks
    assert all(f.startswith("The user") and " I " not in f and " my " not in f for f in add_chunks)
    insight_chunk = next(n for n, t in writes for i in t.insights if i.text == first_q.gold.insight)
    assert insight_chunk == max(add_chunks[about_user(f)] for f in first_q.gold.facts)
    # the insight cites the earlier fact by its view id and the new one by its label
    step = next(s for s in steps if s.index == insight_chunk)
    ins = step.target.insights[0]
    assert any(i.startswith("F") for i in ins.fact_ids) and any(i.startswith("N") for i in ins.fact_ids)
    for fid in ins.fact_ids:
        if fid.startswith("F"):
            assert fid in view_ids(step.view) and f"\n{fid}" in step.messages[1]["content"]


def test_an_insight_cites_only_the_facts_the_products_view_shows():
    """With a view of one fact, an earlier fragment may be out of sight: the insight then cites what the view shows."""
    item = make_item()
    notes = Counter()
    steps = gold_steps(
        build_episode(item, chunk_tokens=60),
        writer_context(embedder=HashEmbeddings(64), view_k=1, view_recent=0, search_mode="vector"),
        notes,
    )
    insights = [(s, i) for s in steps for i in s.target.insights]
    assert {i.text for _, i in insights} == {q.gold.insight for q in item.queries}
    for step, ins in insights:
        shown = view_ids(step.view)
        assert all(f in shown or f.startswith("N") for f in ins.fact_ids)
    assert [i.fact_ids for _, i in insights] == [
        ["N1"],
        ["N1"],
    ]  # the earlier fragment's fact is not among the one shown
    assert notes == {"insight cites part of its facts (the others are not in the view)": 2}


def test_a_gold_records_prompt_is_the_products_prompt_for_the_products_view():
    """Writing the gold targets with write_history shows the writer exactly the records' prompts, and stores the walk's memory."""
    ds = make_dataset(1)
    recs = gold_records(ds, chunk_tokens=60, keep_empty=1.0, ctx=CTX)
    ep = build_episode(ds.items[0], chunk_tokens=60)
    assert [r["chunk_id"] for r in recs] == [c["id"] for c in ep.chunks]
    assert [m["role"] for m in recs[3]["messages"]] == ["system", "user", "assistant"]
    targets = [MemoryUpdate.model_validate_json(r["messages"][-1]["content"]) for r in recs]
    settings = Settings(chunk_tokens=60, embedder="hash:64")
    # the view of chunk k, recalled from a store holding the gold of the chunks before it, renders the record's prompt
    k = next(n for n, t in enumerate(targets) if t.insights)
    store = InMemoryDualStore(HashEmbeddings(64))
    for chunk, target in zip(ep.chunks[:k], targets, strict=False):
        ctx = writer_context(settings, embedder=store.embeddings).with_(
            models={"writer": FakeChatModel(responses=[target])}
        )
        assert write_chunk(ctx, store, ep.namespace, ep.persona, chunk)["status"] == "applied"
    view = recall_view(
        store,
        ep.namespace,
        ep.chunks[k]["text"],
        k=settings.tuning.view_k,
        recent=settings.tuning.view_recent,
        mode=settings.tuning.search_mode,
    )
    product = render_writer_messages(ep.persona, view_text(view), ep.chunks[k]["text"])
    assert [m["content"] for m in recs[k]["messages"][:2]] == [m.content for m in product]
    assert any(f"\n{f} " in product[1].content for i in targets[k].insights for f in i.fact_ids if f.startswith("F"))
    # every chunk: the writer is shown the record's prompt, and ends with the memory the gold walk wrote
    writer = FakeChatModel(responses=targets)
    store = InMemoryDualStore(HashEmbeddings(64))
    report = write_history(
        ds.items[0].dialogue, model=writer, store=store, settings=settings, namespace=ep.namespace, progress=False
    )
    assert not report.failed_chunks and len(writer.calls) == len(recs)
    assert [[m.content for m in call] for call in writer.calls] == [
        [m["content"] for m in r["messages"][:2]] for r in recs
    ]
    walked = EpisodeMemory(CTX, ep.namespace, ep.persona)
    for step in gold_steps(ep, CTX):
        walked.write(step.chunk, walked.draft(step.chunk)[1], step.target)
    assert _memory(walked.store, ep.namespace) == _memory(store, ep.namespace)


def _memory(store, ns):
    return sorted(
        (i.id, i.kind, i.text, i.status, tuple(i.grounding), tuple(i.source.turn_ids))
        for i in store.list(ns, status=None)
    )


def test_every_exported_target_parses_and_cites_existing_facts():
    recs = gold_records(make_dataset(3), chunk_tokens=60, keep_empty=0.5, ctx=CTX)
    assert recs
    for rec in recs:
        assert validate_record(rec) == []
        MemoryUpdate.model_validate_json(rec["messages"][-1]["content"])


def test_validation_catches_dangling_citation_and_bad_json():
    rec = gold_records(make_dataset(1), chunk_tokens=60, keep_empty=0.0, ctx=CTX)[-1]
    bad = json.loads(json.dumps(rec))
    target = json.loads(bad["messages"][-1]["content"])
    target["insights"] = [{"op": "ADD", "id": "M1", "text": "x", "fact_ids": ["F99"]}]
    bad["messages"][-1]["content"] = json.dumps(target)
    assert any("F99" in e for e in validate_record(bad))
    bad["messages"][-1]["content"] = "not json"
    assert validate_record(bad) and "MemoryUpdate" in validate_record(bad)[0]


def test_keep_empty_controls_empty_chunks():
    ds = make_dataset(1)
    none = gold_records(ds, chunk_tokens=60, keep_empty=0.0, ctx=CTX)
    all_ = gold_records(ds, chunk_tokens=60, keep_empty=1.0, ctx=CTX)
    assert all(json.loads(r["messages"][-1]["content"]) != {"facts": [], "insights": []} for r in none)
    assert len(all_) > len(none)


def test_split_by_persona_is_disjoint_and_nonempty():
    recs = gold_records(make_dataset(4), chunk_tokens=60, keep_empty=0.0, ctx=CTX)
    train, held = split_by_persona(recs, eval_ratio=0.25)
    assert train and held
    assert not {r["persona_id"] for r in train} & {r["persona_id"] for r in held}
    assert len(train) + len(held) == len(recs)


def test_export_writes_files_and_llamafactory_info(tmp_path):
    report = export_sft(
        tmp_path, dataset=make_dataset(3), chunk_tokens=60, eval_ratio=0.34, embedder=HashEmbeddings(64)
    )
    assert report.train > 0 and report.eval > 0 and not set(report.personas_train) & set(report.personas_eval)
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info == llamafactory_info()
    entry = info["dualmem_writer_train"]
    assert entry["formatting"] == "sharegpt" and (tmp_path / entry["file_name"]).exists()
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(lines) == report.train


def test_teacher_traces_are_loaded_and_validated(tmp_path):
    good = {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Facts:\nF1: works nights"}],
        "output": {"facts": [], "insights": [{"op": "ADD", "id": "M1", "text": "tired", "fact_ids": ["F1"]}]},
        "persona_id": "p1",
    }
    dangling = {
        **good,
        "output": {"facts": [], "insights": [{"op": "ADD", "id": "M1", "text": "t", "fact_ids": ["F7"]}]},
    }
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(dangling) + "\n")
    recs = load_traces(path)
    assert [validate_record(r) == [] for r in recs] == [True, False]
    with pytest.raises(DatasetError):
        export_sft(tmp_path / "out", traces=[path])
    report = export_sft(tmp_path / "out", traces=[path], strict=False, eval_ratio=0.0)
    assert report.train == 1 and len(report.invalid) == 1 and report.by_source == {"teacher": 1}
    (tmp_path / "broken.jsonl").write_text("{nope\n")
    with pytest.raises(DatasetError, match="line 1"):
        load_traces(tmp_path / "broken.jsonl")


def test_episode_memory_counts_rejected_and_dangling_operations_from_the_plan():
    memory = EpisodeMemory(CTX, ("p", "u"), make_item().dialogue.persona)
    ep = build_episode(make_item(), chunk_tokens=60)
    first, second = ep.chunks[:2]
    upd = MemoryUpdate.model_validate(
        {
            "facts": [{"op": "ADD", "id": "N1", "text": "works nights"}, {"op": "DELETE", "id": "F9"}],
            "insights": [{"op": "ADD", "id": "M1", "text": "tired", "fact_ids": ["N1", "N5"]}],
        }
    )
    turn = memory.write(first, memory.draft(first)[1], upd)
    assert (turn.invalid, turn.dangling, turn.unparseable) == (2, 1, 0) and turn.row["status"] == "applied"
    assert [i.text for i in memory.items()] == ["works nights"] and memory.applied() == 1
    _, view = memory.draft(second)
    assert view_ids(view) == {"F1": memory.items()[0].id}
    turn = memory.write(second, view, '{"facts": [{"op": "DELETE", "id": "F1"}]}')
    assert turn.invalid == 0 and memory.items() == [] and [i.status for i in memory.items(None)] == ["superseded"]
    junk = memory.write(ep.chunks[2], memory.draft(ep.chunks[2])[1], "no json here")
    assert (
        junk.unparseable == 1 and junk.row["status"] == "failed" and memory.applied() == 2
    )  # a failed chunk stays unapplied


def test_episode_memory_lists_items_in_commit_order_not_id_order():
    memory = EpisodeMemory(CTX, ("p", "u"), make_item().dialogue.persona)
    chunks = build_episode(make_item(), chunk_tokens=60).chunks[:4]
    texts = ["first fact", "second fact", "third fact", "fourth fact"]
    for chunk, text in zip(chunks, texts, strict=True):
        update = MemoryUpdate.model_validate({"facts": [{"op": "ADD", "id": "N1", "text": text}], "insights": []})
        assert memory.write(chunk, memory.draft(chunk)[1], update).row["status"] == "applied"
    items = memory.items()
    assert [i.text for i in items] == texts
    assert sorted(i.id for i in items) != [i.id for i in items]  # ids alone would order them otherwise
