"""RoleMemo format: the bundled sample, round trips, atomic writes and broken files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualmem.datasets import dump_rolememo, load_dataset, load_rolememo, load_sample, load_sample_persona, sample_path
from dualmem.errors import DatasetError
from dualmem.schema import TASK_TYPES, Dataset


def test_sample_is_a_valid_rolememo_history():
    item = load_sample()
    d = item.dialogue
    assert d.persona == load_sample_persona()
    assert (
        d.persona.core_values and d.persona.traits and d.persona.background and d.persona.expertise and d.persona.goals
    )
    assert len(d.sessions) == 4 and all(6 <= len(s.turns) <= 10 for s in d.sessions)
    assert all(s.time for s in d.sessions) and [s.time for s in d.sessions] == sorted(s.time for s in d.sessions)
    assert len(item.queries) == 3 and len({q.task_type for q in item.queries}) == 3
    turns = {t.id: t for s in d.sessions for t in s.turns}
    for q in item.queries:
        assert q.task_type in TASK_TYPES and len(q.gold.facts) == 2 and q.gold.insight
        assert len(q.gold.turn_ids) == 2
        for ev in q.meta["evidence"]:
            turn = turns[ev["turn_id"]]
            assert turn.role == "user"  # each fragment is revealed by the user
            assert ev["fragment"].lower() in turn.text.lower()  # a verbatim span


def test_sample_fragments_are_never_echoed_by_the_persona():
    item = load_sample()
    replies = " ".join(t.text.lower() for s in item.dialogue.sessions for t in s.turns if t.role == "assistant")
    for q in item.queries:
        for ev in q.meta["evidence"]:
            assert ev["fragment"].lower() not in replies


def test_rolememo_round_trip_file_and_folder(tmp_path):
    item = load_sample()
    target = dump_rolememo(item, tmp_path / "one.json")
    assert load_rolememo(target).items[0] == item
    data = json.loads(target.read_text())
    assert data["format"] == "rolememo/1" and data["queries"][0]["core_fragments"] == item.queries[0].gold.facts

    second = item.model_copy(deep=True)
    second.dialogue.id = "second/history"
    folder = dump_rolememo(Dataset(name="rolememo", items=[item, second]), tmp_path / "set")
    loaded = load_dataset("rolememo", folder)
    assert sorted(it.dialogue.id for it in loaded.items) == sorted([item.dialogue.id, "second/history"])
    assert not list(folder.glob(".*.tmp"))


def test_rolememo_prefix_drops_queries_beyond_it():
    item = load_rolememo(sample_path(), limit_sessions=2).items[0]
    assert len(item.dialogue.sessions) == 2
    assert all(set(q.gold.session_ids) <= {"s1", "s2"} for q in item.queries)
    assert len(item.queries) < 3


def _broken(tmp_path: Path, edit) -> Path:
    data = json.loads(sample_path().read_text())
    edit(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("edit", "where", "expected"),
    [
        (lambda d: d["queries"][1].update(task_type="Trivia"), "$.queries[1].task_type", "'Decision Guidance'"),
        (lambda d: d["history"][2]["turns"][3].pop("content"), "$.history[2].turns[3].content", "key 'content'"),
        (lambda d: d["history"][0]["turns"][1].update(role="narrator"), "$.history[0].turns[1].role", "'user' or"),
        (lambda d: d["queries"][0]["core_fragments"].pop(), "$.queries[0].core_fragments", "at least 2"),
        (
            lambda d: d["queries"][2]["evidence"][1].update(turn_id="s9-t1"),
            "$.queries[2].evidence[1].turn_id",
            "a turn_id of history",
        ),
        (
            lambda d: d["queries"][2]["evidence"][0].update(session_id="s2"),
            "$.queries[2].evidence[0].session_id",
            "'s1'",
        ),
        (lambda d: d.update(format="rolememo/0"), "$.format", "'rolememo/1'"),
        (lambda d: d["history"][1]["turns"][0].update(turn_id="s1-t1"), "$.history[1].turns[0].turn_id", "unique"),
    ],
)
def test_broken_rolememo_names_the_path(tmp_path, edit, where, expected):
    path = _broken(tmp_path, edit)
    with pytest.raises(DatasetError) as info:
        load_rolememo(path)
    assert info.value.path == where
    assert expected in info.value.expected
    assert str(info.value).startswith(f"{path}: {where}: expected ")


def test_dump_refuses_invalid_data_and_leaves_old_file(tmp_path):
    item = load_sample()
    target = dump_rolememo(item, tmp_path / "keep.json")
    before = target.read_text()
    bad = item.model_copy(deep=True)
    bad.queries[0].gold.facts = ["only one"]
    with pytest.raises(DatasetError, match="core_fragments"):
        dump_rolememo(bad, target)
    assert target.read_text() == before
    no_type = item.model_copy(deep=True)
    no_type.queries[0].task_type = None
    with pytest.raises(ValueError, match="task_type"):
        dump_rolememo(no_type, tmp_path / "other.json")
    assert not (tmp_path / "other.json").exists()
