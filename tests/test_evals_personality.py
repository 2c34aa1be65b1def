"""InCharacter personality tests with fake models: batching, metrics, interviews with and without memory, resume, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import SHARED_DATA, need
from typer.testing import CliRunner

from dualmem.config import Settings
from dualmem.datasets import dump_rolememo, load_sample
from dualmem.evals import incharacter as ic
from dualmem.evals.personality import assessment_schema
from dualmem.evals.personality_run import run_personality
from dualmem.schema import Dataset
from dualmem.testing import FakeChatModel

INCHARACTER = SHARED_DATA / "incharacter"
MOOD = re.compile(r"\[mood: (\w+)\]")


@pytest.fixture
def data_dir():
    return need(INCHARACTER)


def test_answers_are_rated_in_batches_of_three_or_four():
    for n in range(6, 25):
        batches = ic.split_batches(list(range(n)))
        assert all(3 <= len(b) <= 4 for b in batches) and sorted(x for b in batches for x in b) == list(range(n))
    assert ic.split_batches([1, 2, 3, 4, 5]) == [[1, 2, 3, 4, 5]]  # too few to split


def test_questionnaires_and_labels_load(data_dir):
    bfi, mbti = ic.load_questionnaire(data_dir, "bfi"), ic.load_questionnaire(data_dir, "MBTI")
    assert len(bfi.items) == 44 and len(mbti.items) == 60 and mbti.dimensions == ("E/I", "S/N", "T/F", "P/J")
    assert sum(len(bfi.items_of(d)) for d in bfi.dimensions) == 44 and set(bfi.descriptions) >= set(bfi.dimensions)
    labels = ic.load_labels(data_dir / "characters_labels.json")
    assert len(labels) == 32 and labels["Sheldon-en"]["BFI"]["Extraversion"]["type"] == "L"
    assert len(ic.load_characters(data_dir)) == 32
    assert ic.mbti_labels("ESTJ") == {
        "E/I": {"score": None, "type": "H"},
        "S/N": {"score": None, "type": "H"},
        "T/F": {"score": None, "type": "H"},
        "P/J": {"score": None, "type": "L"},
    }


def test_fidelity_skips_x_labels_and_normalises_errors():
    labels = {
        "a": {"Extraversion": {"score": 5.0, "type": "H"}, "Openness": {"score": 3.0, "type": "X"}},
        "b": {"Extraversion": {"score": 1.0, "type": "L"}, "Neuroticism": {"score": 4.0, "type": "H"}},
    }
    preds = {"a": {"Extraversion": 4.0, "Openness": 1.0}, "b": {"Extraversion": 2.0, "Neuroticism": 2.0}}
    f = ic.fidelity(preds, labels, ic.BFI_SCALE)
    assert f["acc_dim"] == pytest.approx(2 / 3) and f["acc_full"] == 0.5 and f["n_dimensions"] == 3
    assert f["mae"] == pytest.approx((0.25 + 0.25 + 0.5) / 3) and f["mse"] == pytest.approx((0.0625 * 2 + 0.25) / 3)
    assert f["per_dimension"] == {"Extraversion": 1.0, "Neuroticism": 0.0}


def test_a_16personalities_rating_must_split_100_percent(data_dir):
    schema = assessment_schema(ic.load_questionnaire(data_dir, "mbti"), "E/I")
    assert schema.model_validate({"analysis": "", "result": {"E": 70, "I": 30}}).result.E == 70
    with pytest.raises(ValueError, match="sum to 90"):
        schema.model_validate({"analysis": "", "result": {"E": 60, "I": 30}})


def agent_model(mood_of):
    """An agent that states a mood chosen from its system prompt (persona and memory)."""

    def answer(messages):
        system = str(messages[0].content)
        name = re.search(r"You are (.+?)\.", system).group(1)
        return f"I am {name}. [mood: {mood_of(system)}] That is how I would put it."

    return FakeChatModel(responses=[answer], cycle=True)


def judge_model(received):
    """A rater that scores high when the exchanges show an outgoing mood, low otherwise, and keeps what it saw."""

    def rate(messages):
        received.append(messages)
        text = str(messages[-1].content)
        high = "outgoing" in MOOD.findall(text)
        if (
            "E/I" in str(messages[0].content)
            or "S/N" in str(messages[0].content)
            or "T/F" in str(messages[0].content)
            or "P/J" in str(messages[0].content)
        ):
            first, second = re.search(r'"result": \{ "(\w)": <percentage 1>, "(\w)"', str(messages[0].content)).groups()
            return {"analysis": "scripted", "result": {first: 80 if high else 20, second: 20 if high else 80}}
        return {"analysis": "scripted", "result": 4.5 if high else 1.5}

    return FakeChatModel(responses=[rate], cycle=True)


def test_incharacter_characters_are_interviewed_rated_and_scored_once(data_dir, tmp_path):
    received: list = []
    agent = agent_model(lambda system: "outgoing" if "Hermione" in system else "reserved")
    judge = judge_model(received)
    kwargs = dict(
        personas=["Hermione-en", "Sheldon-en"],
        out=tmp_path / "run",
        model=agent,
        judge=judge,
        settings=Settings(embedder="hash:64", concurrency=2),
        progress=False,
    )
    run = run_personality(data_dir, **kwargs)
    report = json.loads((run / "personality.json").read_text())
    assert report["meta"]["conditions"] == ["no-memory"]  # characters without a history
    assert len(agent.calls) == 2 * (44 + 60)
    batches = sum(
        len(ic.split_batches(q.items_of(d)))
        for q in (ic.load_questionnaire(data_dir, n) for n in ("bfi", "mbti"))
        for d in q.dimensions
    )
    assert len(received) == 2 * batches
    for messages in received:  # the rater sees 3-4 anonymous exchanges
        text = str(messages[0].content) + str(messages[-1].content)
        assert not re.search(r"Hermione|Sheldon|Harry|Leonard", text) and 3 <= text.count("<the experimenter>: 「") <= 4
    labels = ic.load_labels(data_dir / "characters_labels.json")
    for qname, predicted in (
        ("BFI", {"Hermione-en": "H", "Sheldon-en": "L"}),
        ("16Personalities", {"Hermione-en": "H", "Sheldon-en": "L"}),
    ):
        marks = {
            s: [lab["type"] == predicted[s] for lab in labels[s][qname].values() if lab["type"] != "X"]
            for s in predicted
        }
        got = report["fidelity"]["no-memory"][qname]
        assert got["acc_dim"] == pytest.approx(
            sum(sum(m) for m in marks.values()) / sum(len(m) for m in marks.values())
        )
        assert got["acc_full"] == pytest.approx(sum(all(m) for m in marks.values()) / 2)
    hermione = report["subjects"]["Hermione-en"]["conditions"]["no-memory"]
    assert hermione["BFI"]["Extraversion"]["score"] == 4.5 and hermione["16Personalities"]["E/I"]["score"] == 80
    assert len((run / "interviews.jsonl").read_text().splitlines()) == 2 * (44 + 60)
    assert "Acc_dim" in (run / "personality.md").read_text()

    calls = (len(agent.calls), len(received))
    again = run_personality(data_dir, **kwargs)  # the same test again: everything comes from the journal
    assert (len(agent.calls), len(received)) == calls
    assert json.loads((again / "personality.json").read_text())["fidelity"] == report["fidelity"]


def test_the_same_agent_with_and_without_memory(data_dir, tmp_path):
    item = load_sample()
    item.dialogue.persona = item.dialogue.persona.model_copy(update={"personality": {"MBTI": "ESTJ"}})
    path = dump_rolememo(Dataset(name="rolememo", items=[item]), tmp_path / "data")
    received: list = []
    agent = agent_model(lambda system: "reserved" if "(nothing relevant remembered)" in system else "outgoing")
    run = run_personality(
        path,
        dataset_kind="rolememo",
        framework="raw-turns",
        questionnaires="mbti",
        out=tmp_path / "run",
        model=agent,
        judge=judge_model(received),
        progress=False,
        settings=Settings(embedder="hash:64", incharacter_dir=str(data_dir), store_uri=str(tmp_path / "unused")),
    )
    report = json.loads((run / "personality.json").read_text())
    sid = item.dialogue.id
    assert report["subjects"][sid]["ingest"] and all("error" not in row for row in report["subjects"][sid]["ingest"])
    memory = report["subjects"][sid]["conditions"]["memory"]["16Personalities"]
    plain = report["subjects"][sid]["conditions"]["no-memory"]["16Personalities"]
    assert {d["type"] for d in memory.values()} == {"H"} and {d["type"] for d in plain.values()} == {"L"}
    assert report["fidelity"]["memory"]["16Personalities"]["acc_dim"] == 0.75  # E, S, T right; J (label) vs P
    assert report["fidelity"]["no-memory"]["16Personalities"]["acc_dim"] == 0.25
    assert report["agreement"]["16Personalities"] == {
        "same_type": 0.0,
        "mean_abs_diff": pytest.approx(0.6),
        "n_dimensions": 4,
    }


def test_cli_entry(data_dir, tmp_path):
    from dualmem.cli import app

    result = CliRunner().invoke(
        app,
        [
            "eval",
            "personality",
            str(data_dir),
            "--personas",
            "Luna-en",
            "--questionnaires",
            "bfi",
            "--model",
            "fake:memory",
            "--judge",
            "fake:memory",
            "--out",
            str(tmp_path / "p"),
            "--set",
            "embedder=hash:64",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "p" / "personality.json").read_text())
    assert set(report["subjects"]) == {"Luna-en"} and report["fidelity"]["no-memory"]["BFI"]["n_dimensions"] == 5
    assert Path(tmp_path / "p" / "personality.md").exists()


def test_a_run_folder_lends_its_ingested_memory(data_dir, tmp_path):
    from dualmem.evaluate import run_eval

    item = load_sample()
    path = dump_rolememo(Dataset(name="rolememo", items=[item]), tmp_path / "data")
    run = run_eval(
        "rolememo",
        path,
        "raw-turns",
        out=tmp_path / "eval",
        respond=False,
        progress=False,
        ragas=False,
        settings=Settings(embedder="hash:64", incharacter_dir=str(data_dir)),
    )
    received: list = []
    agent = agent_model(lambda system: "reserved" if "(nothing relevant remembered)" in system else "outgoing")
    out = run_personality(
        run,
        questionnaires="bfi",
        out=tmp_path / "p",
        model=agent,
        judge=judge_model(received),
        progress=False,
        settings=Settings(embedder="hash:64", incharacter_dir=str(data_dir)),
    )
    report = json.loads((out / "personality.json").read_text())
    assert report["meta"]["mode"] == "run" and report["meta"]["framework"] == "raw-turns"
    subject = report["subjects"][item.dialogue.id]
    assert "ingest" not in subject  # nothing ingested again: the run's memory is used as it is
    assert {d["type"] for d in subject["conditions"]["memory"]["BFI"].values()} == {"H"}
    assert {d["type"] for d in subject["conditions"]["no-memory"]["BFI"].values()} == {"L"}
