"""Dataset loaders on the real shared files, on prefixes, and on broken files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dualmem.datasets import dump_realmem, load_dataset, load_locomo, load_realmem, normalise_evidence
from dualmem.errors import ConfigurationError, DatasetError

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / ".." / "shared" / "data"
SOPHIE = SHARED / "realmem" / "Sophie_Dubois_dialogues_256k.json"
LOCOMO = SHARED / "locomo" / "locomo10.json"


def need(path: Path) -> Path:
    """Return ``path`` or skip, naming the missing shared file."""
    if not path.exists():
        pytest.skip(f"shared data file {path} is absent (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="module")
def sophie_raw() -> dict:
    return json.loads(need(SOPHIE).read_text())


@pytest.fixture(scope="module")
def locomo_raw() -> list:
    return json.loads(need(LOCOMO).read_text())


# --------------------------------------------------------------------------- RealMem


def test_realmem_maps_sessions_turns_and_queries(sophie_raw):
    ds = load_dataset("realmem", SOPHIE)
    assert ds.name == "realmem" and len(ds.items) == 1
    item = ds.items[0]
    raw_sessions = sophie_raw["dialogues"]
    assert item.dialogue.id == sophie_raw["_metadata"]["person_name"] == item.dialogue.persona.id
    assert [s.id for s in item.dialogue.sessions] == [s["session_uuid"] for s in raw_sessions]
    assert [s.time for s in item.dialogue.sessions] == [s["current_time"] for s in raw_sessions]
    first = item.dialogue.sessions[0]
    assert first.meta["session_identifier"] == raw_sessions[0]["session_identifier"]
    assert len(first.turns) == len(raw_sessions[0]["dialogue_turns"])
    assert [m.content for m in first.memory_points] == [m["content"] for m in raw_sessions[0]["extracted_memory"]]
    n_queries = sum(t.get("is_query", False) for s in raw_sessions for t in s["dialogue_turns"])
    assert len(item.queries) == n_queries > 0

    position = {s.id: i for i, s in enumerate(item.dialogue.sessions)}
    for query in item.queries:
        session = item.dialogue.sessions[position[query.session_id]]
        turn = session.turns[query.turn_index]
        assert turn.is_query and turn.role == "user" and turn.text == query.text and turn.query_id == query.id
        reply = session.turns[query.turn_index + 1]
        assert reply.role == "assistant" and query.answer == reply.text
        assert query.gold.session_ids == reply.meta["memory_session_uuids"]
        assert query.gold.memory_points == [m["content"] for m in reply.meta["memory_used"]]
        assert query.category


def test_realmem_filler_sessions_are_flagged():
    path = need(SHARED / "realmem" / "Liam_O_Connor_dialogues_256k.json")
    raw = json.loads(path.read_text())
    item = load_realmem(path).items[0]
    flagged = [s.filler for s in item.dialogue.sessions]
    expected = [s["session_identifier"].startswith("Enhanced") for s in raw["dialogues"]]
    assert flagged == expected and any(flagged) and not all(flagged)
    assert not any(q.session_id in {s.id for s in item.dialogue.sessions if s.filler} for q in item.queries)


def test_realmem_prefix_keeps_only_its_queries():
    item = load_dataset("realmem", need(SOPHIE), limit_sessions=10).items[0]
    ids = {s.id for s in item.dialogue.sessions}
    assert len(ids) == 10
    assert item.queries and all(q.session_id in ids for q in item.queries)
    full = load_realmem(SOPHIE).items[0]
    assert len(item.queries) < len(full.queries)


def test_realmem_loads_fast():
    need(SHARED / "realmem" / "Ethan_Hunt_dialogues_256k.json")
    start = time.perf_counter()
    load_realmem(SHARED / "realmem" / "Ethan_Hunt_dialogues_256k.json")  # the largest file, 3.6 MB
    assert time.perf_counter() - start < 1.0


def test_realmem_folder_loads_every_persona():
    folder = need(SHARED / "realmem")
    ds = load_realmem(folder)
    assert len(ds.items) == len(list(folder.glob("*_dialogues_*.json"))) >= 2
    assert len({it.dialogue.id for it in ds.items}) == len(ds.items)


def test_realmem_round_trip(tmp_path):
    item = load_realmem(need(SOPHIE), limit_sessions=25).items[0]
    target = dump_realmem(item.dialogue, item.queries, tmp_path / "out" / "Sophie_dialogues_256k.json")
    again = load_realmem(target).items[0]
    assert again == item
    assert not list((tmp_path / "out").glob(".*.tmp"))  # no temporary file left behind


def test_realmem_dump_marks_queries_given_separately(tmp_path):
    item = load_realmem(need(SOPHIE), limit_sessions=20).items[0]
    bare = item.dialogue.model_copy(deep=True)
    for session in bare.sessions:  # strip the query flags and gold from the turns
        for turn in session.turns:
            turn.is_query, turn.query_id = False, None
            turn.meta = {}
    queries = [q.model_copy(update={"meta": {}}) for q in item.queries]
    again = load_realmem(dump_realmem(bare, queries, tmp_path / "x_dialogues_1.json")).items[0]
    assert [(q.id, q.text, q.session_id, q.turn_index) for q in again.queries] == [
        (q.id, q.text, q.session_id, q.turn_index) for q in item.queries
    ]
    assert [q.gold.session_ids for q in again.queries] == [q.gold.session_ids for q in item.queries]
    assert [q.gold.memory_points for q in again.queries] == [q.gold.memory_points for q in item.queries]


# --------------------------------------------------------------------------- LoCoMo


def test_locomo_maps_conversations(locomo_raw):
    ds = load_dataset("locomo", LOCOMO)
    assert [it.dialogue.id for it in ds.items] == [c["sample_id"] for c in locomo_raw]
    conv = locomo_raw[0]
    item = ds.items[0]
    raw_turns = conv["conversation"]["session_1"]
    s1 = item.dialogue.sessions[0]
    assert s1.id == "session_1" and s1.time == conv["conversation"]["session_1_date_time"]
    assert [t.id for t in s1.turns] == [t["dia_id"] for t in raw_turns]
    a, b = conv["conversation"]["speaker_a"], conv["conversation"]["speaker_b"]
    assert {t.role for t in s1.turns if t.speaker == a} == {"user"}
    assert {t.role for t in s1.turns if t.speaker == b} == {"assistant"}
    captioned = [(t, r) for s in item.dialogue.sessions for t in s.turns for r in [t.meta] if r.get("blip_caption")]
    assert captioned and all(r["blip_caption"] in t.text for t, r in captioned)
    assert len(item.queries) == len(conv["qa"])
    for query, qa in zip(item.queries, conv["qa"], strict=True):
        assert query.text == qa["question"] and query.category == str(qa["category"])
        expected = qa["adversarial_answer"] if qa["category"] == 5 else qa["answer"]
        assert query.answer == str(expected)


def test_locomo_gold_ids_name_real_turns_and_odd_ids_are_split(locomo_raw):
    ds = load_locomo(LOCOMO)
    for item in ds.items:
        turns = {t.id: s.id for s in item.dialogue.sessions for t in s.turns}
        for q in item.queries:
            assert all(t in turns for t in q.gold.turn_ids)
            assert q.gold.session_ids == list(dict.fromkeys(turns[t] for t in q.gold.turn_ids))
    odd = next(q for q in ds.items[0].queries if "D8:6; D9:17" in q.meta["evidence"])
    assert odd.gold.turn_ids == ["D8:6", "D9:17"] and odd.gold.session_ids == ["session_8", "session_9"]


@pytest.mark.parametrize(
    ("raw", "ids"),
    [
        ("D8:6; D9:17", ["D8:6", "D9:17"]),
        ("D:11:26", ["D11:26"]),
        ("D30:05", ["D30:5"]),
        ("D", []),
        ("D9:1 D4:4 D4:6", ["D9:1", "D4:4", "D4:6"]),
    ],
)
def test_normalise_evidence(raw, ids):
    assert normalise_evidence(raw) == ids


def test_locomo_prefix():
    item = load_dataset("locomo", need(LOCOMO), limit_sessions=3).items[0]
    assert [s.id for s in item.dialogue.sessions] == ["session_1", "session_2", "session_3"]
    assert item.queries and all(
        set(q.gold.session_ids) <= {"session_1", "session_2", "session_3"} for q in item.queries
    )


# --------------------------------------------------------------------------- broken files


def _write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _small_realmem(sophie_raw: dict) -> dict:
    return {
        "_metadata": dict(sophie_raw["_metadata"]),
        "dialogues": json.loads(json.dumps(sophie_raw["dialogues"][:5])),
    }


def test_realmem_missing_key_names_the_path(tmp_path, sophie_raw):
    data = _small_realmem(sophie_raw)
    del data["dialogues"][3]["dialogue_turns"][2]["speaker"]
    path = _write(tmp_path, "bad_dialogues_1.json", data)
    with pytest.raises(DatasetError) as info:
        load_realmem(path)
    assert info.value.path == "$.dialogues[3].dialogue_turns[2].speaker"
    assert (
        str(info.value)
        == f"{path}: $.dialogues[3].dialogue_turns[2].speaker: expected key 'speaker', found nothing (key missing)"
    )
    assert "\n" not in str(info.value)


def test_realmem_wrong_type_names_the_path(tmp_path, sophie_raw):
    data = _small_realmem(sophie_raw)
    data["dialogues"][1]["dialogue_turns"][0]["speaker"] = "Narrator"
    data_path = _write(tmp_path, "bad_dialogues_2.json", data)
    with pytest.raises(DatasetError) as info:
        load_realmem(data_path)
    assert info.value.path == "$.dialogues[1].dialogue_turns[0].speaker"
    assert "'User' or 'Assistant'" in info.value.expected and "Narrator" in info.value.found

    data = _small_realmem(sophie_raw)
    data["dialogues"][4]["session_uuid"] = 17
    with pytest.raises(
        DatasetError, match=r"\$\.dialogues\[4\]\.session_uuid: expected a valid string, found integer 17"
    ):
        load_realmem(_write(tmp_path, "bad_dialogues_3.json", data))


def test_bad_json_reports_line_and_column(tmp_path):
    path = _write(tmp_path, "broken_dialogues_1.json", '{\n  "_metadata": {"person_name": "X"},\n  "dialogues": [,]\n}')
    with pytest.raises(DatasetError) as info:
        load_realmem(path)
    assert info.value.path == "$" and "line 3 column 17" in info.value.found


def test_locomo_broken_turn_names_the_path(tmp_path, locomo_raw):
    data = json.loads(json.dumps(locomo_raw[:1]))
    data[0]["conversation"]["session_2"][4]["text"] = ["not", "text"]
    with pytest.raises(DatasetError) as info:
        load_locomo(_write(tmp_path, "locomo_bad.json", data))
    assert info.value.path == "$[0].conversation.session_2[4].text"

    data = json.loads(json.dumps(locomo_raw[:1]))
    del data[0]["qa"][7]["question"]
    with pytest.raises(DatasetError) as info:
        load_locomo(_write(tmp_path, "locomo_bad2.json", data))
    assert info.value.path == "$[0].qa[7].question"


def test_missing_file_and_unknown_kind(tmp_path):
    with pytest.raises(DatasetError, match="no such"):
        load_dataset("realmem", tmp_path / "nope.json")
    with pytest.raises(ConfigurationError, match="rolememo, realmem, locomo"):
        load_dataset("csv", tmp_path)
