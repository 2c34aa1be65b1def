"""SFT export from RoleMemo gold and teacher traces: targets valid, citations grounded, split by persona."""

from __future__ import annotations

import json

import pytest
from fixtures.train_data import make_dataset, make_item

from dualmem.errors import DatasetError
from dualmem.prompts.writer import render_writer_messages
from dualmem.schema import MemoryUpdate
from dualmem.training.episode import MemoryState, View, build_episode, gold_steps
from dualmem.training.export import (
    export_sft,
    gold_records,
    llamafactory_info,
    load_traces,
    split_by_persona,
    validate_record,
)
from dualmem.training.targets import about_user


def test_gold_steps_add_fragments_where_they_appear_and_the_insight_once_both_are_seen():
    item = make_item()
    ep = build_episode(item, chunk_tokens=60)
    steps = gold_steps(ep)
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
            assert fid in step.view.ids and fid in step.view.text


def test_records_use_the_writers_exact_prompt():
    ds = make_dataset(1)
    recs = gold_records(ds, chunk_tokens=60, keep_empty=1.0)
    ep = build_episode(ds.items[0], chunk_tokens=60)
    steps = gold_steps(ep)
    assert len(recs) == len(steps)
    msgs = render_writer_messages(ep.persona, steps[3].view.text, steps[3].chunk.text)
    assert [m["content"] for m in recs[3]["messages"][:2]] == [m.content for m in msgs]
    assert [m["role"] for m in recs[3]["messages"]] == ["system", "user", "assistant"]


def test_every_exported_target_parses_and_cites_existing_facts():
    recs = gold_records(make_dataset(3), chunk_tokens=60, keep_empty=0.5)
    assert recs
    for rec in recs:
        assert validate_record(rec) == []
        MemoryUpdate.model_validate_json(rec["messages"][-1]["content"])


def test_validation_catches_dangling_citation_and_bad_json():
    rec = gold_records(make_dataset(1), chunk_tokens=60, keep_empty=0.0)[-1]
    bad = json.loads(json.dumps(rec))
    target = json.loads(bad["messages"][-1]["content"])
    target["insights"] = [{"op": "ADD", "id": "M1", "text": "x", "fact_ids": ["F99"]}]
    bad["messages"][-1]["content"] = json.dumps(target)
    assert any("F99" in e for e in validate_record(bad))
    bad["messages"][-1]["content"] = "not json"
    assert validate_record(bad) and "MemoryUpdate" in validate_record(bad)[0]


def test_keep_empty_controls_empty_chunks():
    ds = make_dataset(1)
    none = gold_records(ds, chunk_tokens=60, keep_empty=0.0)
    all_ = gold_records(ds, chunk_tokens=60, keep_empty=1.0)
    assert all(json.loads(r["messages"][-1]["content"]) != {"facts": [], "insights": []} for r in none)
    assert len(all_) > len(none)


def test_split_by_persona_is_disjoint_and_nonempty():
    recs = gold_records(make_dataset(4), chunk_tokens=60, keep_empty=0.0)
    train, held = split_by_persona(recs, eval_ratio=0.25)
    assert train and held
    assert not {r["persona_id"] for r in train} & {r["persona_id"] for r in held}
    assert len(train) + len(held) == len(recs)


def test_export_writes_files_and_llamafactory_info(tmp_path):
    report = export_sft(tmp_path, dataset=make_dataset(3), chunk_tokens=60, eval_ratio=0.34)
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
    dangling = {**good, "output": {"facts": [], "insights": [{"op": "ADD", "id": "M1", "text": "t", "fact_ids": ["F7"]}]}}
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


def test_memory_state_rejects_dangling_and_unknown_ids():
    state = MemoryState()
    upd = MemoryUpdate.model_validate(
        {
            "facts": [{"op": "ADD", "id": "N1", "text": "works nights"}, {"op": "DELETE", "id": "F9"}],
            "insights": [{"op": "ADD", "id": "M1", "text": "tired", "fact_ids": ["N1", "N5"]}],
        }
    )
    stats = state.apply(upd, View("", {}), "c1")
    assert (stats.applied, stats.invalid, stats.dangling) == (1, 1, 1)
    assert sorted(state.texts()) == ["tired", "works nights"]
    view = state.view("nights")
    assert set(view.ids) == {"F1", "I1"}
    stats = state.apply(MemoryUpdate.model_validate({"facts": [{"op": "DELETE", "id": "F1"}]}), view, "c2")
    assert stats.applied == 1 and state.texts() == ["tired"]
