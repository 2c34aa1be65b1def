"""`dualmem generate` from the command line, offline: scripted models by spec, real files written, clean failures."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REALMEM_SOPHIE, need
from typer.testing import CliRunner

from dualmem.cli import app
from dualmem.datasets import load_dataset, sample_path

runner = CliRunner()
PERSONA = str(sample_path("sample_persona.json"))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:64")
    monkeypatch.setenv("DUALMEM_STORE_URI", str(tmp_path / "db"))
    monkeypatch.setenv("DUALMEM_CHECKPOINT_PATH", str(tmp_path / "ck.sqlite"))
    monkeypatch.setenv("DUALMEM_RETRY_BACKOFF", "0.01")
    return tmp_path


def run(*args: str):
    return runner.invoke(app, list(args), terminal_width=200)


def clean_error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("spec", ["fake:weave", "fake:memory"])
def test_generate_rolememo_runs_offline_on_the_sample_persona(env, spec):
    out = env / "out"
    result = run(
        "generate",
        "rolememo",
        "--personas",
        PERSONA,
        "--out",
        str(out),
        "-m",
        spec,
        "--per-type",
        "1",
        "--rounds",
        "6",
        "--lengths",
        "2k,4k",
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["queries_kept"] == 4 and len(manifest["files"]) == 2
    for folder in ("2k", "4k"):
        item = load_dataset("rolememo", out / folder).items[0]
        assert item.dialogue.persona.name == "Mara Okafor" and len(item.queries) == 4


def test_a_run_that_keeps_nothing_exits_1_with_the_rejections_by_kind(env, monkeypatch):
    import dualmem.testing.scripted
    from dualmem.models import _build_chat_model

    class Generic(dualmem.testing.scripted.WeaveScript):
        def __init__(self) -> None:
            super().__init__(generic=("insight",))  # every insight fails the specificity check

    monkeypatch.setattr(dualmem.testing.scripted, "WeaveScript", Generic)
    _build_chat_model.cache_clear()
    try:
        result = run(
            "generate",
            "rolememo",
            "--personas",
            PERSONA,
            "--out",
            str(env / "out"),
            "-m",
            "fake:weave",
            "--per-type",
            "1",
            "--lengths",
            "2k",
        )
    finally:
        _build_chat_model.cache_clear()
    assert result.exit_code == 1, result.output
    assert "specificity: failed perspective_unique, testable: 4" in result.stderr.replace("\n", " ")
    manifest = json.loads((env / "out" / "manifest.json").read_text())
    assert manifest["files"] == [] and manifest["checks"]["specificity"]["rejections"] == {
        "failed perspective_unique, testable": 4
    }


def test_a_simulation_with_no_session_exits_1_with_its_issues(env, monkeypatch):
    import dualmem.testing.scripted
    from dualmem.models import _build_chat_model

    class NoPlans(dualmem.testing.scripted.SimScript):
        def __call__(self, messages, tool):
            return {"projects": []} if tool == "ProjectOutline" else super().__call__(messages, tool)

    monkeypatch.setattr(dualmem.testing.scripted, "SimScript", NoPlans)
    _build_chat_model.cache_clear()
    try:
        result = run(
            "generate",
            "realmem",
            "--persona",
            PERSONA,
            "--out",
            str(env / "rm"),
            "-m",
            "fake:simulate",
            "--sessions",
            "2",
        )
    finally:
        _build_chat_model.cache_clear()
    assert result.exit_code == 1, result.output
    assert "no session could be simulated" in result.stderr.replace("\n", " ")


def test_generate_realmem_runs_offline_and_counts_sessions_per_project(env):
    result = run(
        "generate", "realmem", "--persona", PERSONA, "--out", str(env / "rm"), "-m", "fake:simulate", "--sessions", "5"
    )
    assert result.exit_code == 0, result.output
    data = json.loads((env / "rm" / "mara-okafor_dialogues_sim.json").read_text())
    idents = [s["session_identifier"] for s in data["dialogues"]]
    assert len(idents) == 5 and all(re.fullmatch(r"[A-Z][A-Za-z_]*_\d+:S\d+_01", i) for i in idents)
    per_project: dict[str, list[int]] = {}
    for ident in idents:
        project, sess = ident.split(":")
        per_project.setdefault(project, []).append(int(sess[1:].split("_")[0]))
    assert all(ns == list(range(1, len(ns) + 1)) for ns in per_project.values()), (
        idents
    )  # S1, S2... within each project
    assert len(load_dataset("realmem", env / "rm").items[0].dialogue.sessions) == 5


def test_generated_realmem_matches_the_real_files_schema_and_conventions(env):
    real = json.loads(need(REALMEM_SOPHIE).read_text())
    result = run(
        "generate", "realmem", "--persona", PERSONA, "--out", str(env / "rm"), "-m", "fake:simulate", "--sessions", "4"
    )
    assert result.exit_code == 0, result.output
    sim = json.loads((env / "rm" / "mara-okafor_dialogues_sim.json").read_text())

    def shape(data):
        sessions = data["dialogues"]
        turns = [t for s in sessions for t in s["dialogue_turns"]]
        points = [m for s in sessions for m in s["extracted_memory"]]
        queries = [t for t in turns if t["is_query"]]
        answers = [t for t in turns if "memory_used" in t]
        return (
            {
                "meta": set(data["_metadata"]) >= {"person_name", "total_sessions", "total_tokens"},
                "session": set().union(*(s.keys() for s in sessions)),
                "turn": {k for t in turns if not t["is_query"] and "memory_used" not in t for k in t},
                "query": set().union(*(t.keys() for t in queries)),
                "answer": set().union(*(t.keys() for t in answers)),
                "point": set().union(*(m.keys() for m in points)),
            },
            sessions,
            points,
            queries,
        )

    real_shape, _, real_points, real_queries = shape(real)
    sim_shape, sessions, points, queries = shape(sim)
    assert sim_shape == real_shape
    assert points and queries
    assert {p["type"] for p in points} <= {p["type"] for p in real_points}  # "Static", "Dynamic", "Schedule"
    assert {q["category_name"] for q in queries} <= {q["category_name"] for q in real_queries}
    assert {q["session_type"] for q in queries} <= {q["session_type"] for q in real_queries}
    assert all(re.fullmatch(r"Q-\d{4}", q["query_id"]) for q in queries)
    assert all(re.fullmatch(r"[A-Z][A-Za-z]*(_[A-Z][A-Za-z]*)*", q["topic"]) for q in queries)
    for s in sessions:
        assert re.fullmatch(r"[0-9a-f]{8}", s["session_uuid"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \([A-Z][a-z]+day\)", s["current_time"])
        for p in s["extracted_memory"]:  # source_turn is 1-based, as in the real files: the snapshot is that turn
            assert s["dialogue_turns"][p["source_turn"] - 1]["content"] == p["source_content_snapshot"]
            assert p["index"].startswith(s["session_identifier"].replace(":", "-SM-"))


def test_bad_lengths_and_unknown_fake_are_one_line_errors(env):
    line = clean_error(
        run(
            "generate",
            "rolememo",
            "--personas",
            PERSONA,
            "--out",
            str(env / "o"),
            "-m",
            "fake:weave",
            "--lengths",
            "32kb",
        )
    )
    assert "--lengths '32kb'" in line
    line = clean_error(run("generate", "rolememo", "--personas", PERSONA, "--out", str(env / "o"), "-m", "fake:nope"))
    assert "fake:weave" in line and "fake:simulate" in line
