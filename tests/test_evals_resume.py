"""Resuming `dualmem eval`: a run killed mid-persona continues without repeating a model call; run folders are claimed per spec."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import REALMEM_SOPHIE, need
from fixtures.eval_cli import eval_cli, finish
from fixtures.standin import OpenAIStandin

from dualmem.config import Settings
from dualmem.datasets import dump_realmem, dump_rolememo, load_realmem, load_sample
from dualmem.errors import ConfigurationError
from dualmem.evals.fakes import TurnLogFramework
from dualmem.evals.record import RunRecord, record_uri
from dualmem.evals.reports import read_records
from dualmem.evals.runspec import read_run
from dualmem.evaluate import resume_eval, run_eval
from dualmem.frameworks import FrameworkContext
from dualmem.schema import Dataset
from dualmem.testing import HashEmbeddings

STABLE = ("query_id", "persona", "answer", "metrics", "judges", "errors")


def _cli(data: Path, out: Path, base_url: str) -> subprocess.Popen[str]:
    """Start `dualmem eval` on the real dualmem framework against the stand-in endpoint (LanceDB on disk)."""
    return eval_cli(data, out, base_url, limit=3)


def _stable(records: list[dict]) -> list[dict]:
    return [{k: r[k] for k in STABLE} for r in records]


@pytest.fixture
def sophie_prefix(tmp_path):
    item = load_realmem(need(REALMEM_SOPHIE), limit_sessions=8).items[0]
    return dump_realmem(item, path=tmp_path / "Sophie_Dubois_dialogues_test.json")


def test_a_run_killed_mid_persona_resumes_without_repeating_a_model_call(sophie_prefix, tmp_path):
    with OpenAIStandin(latency_s=0.0) as clean:
        finish(_cli(sophie_prefix, tmp_path / "clean", clean.base_url))
    total = len(clean.calls)
    assert {c["schema"] for c in clean.calls} >= {"MemoryUpdate", None, "AnswerVerdict"}  # writer, reader, judge

    with OpenAIStandin(latency_s=0.0, hold_at=total // 2 + 1) as first:
        proc = _cli(sophie_prefix, tmp_path / "run", first.base_url)
        assert first.wait_held(timeout=240), "the run never reached the call where it is killed"
        proc.send_signal(signal.SIGKILL)  # as a crash or `kill -9` would: nothing gets to clean up
        proc.wait(timeout=30)
        first.abandon()
    answered_before = len(first.calls)
    assert answered_before == total // 2
    run = read_run(tmp_path / "run")
    steps = RunRecord(record_uri(str(tmp_path / "run" / "lancedb"), run["fingerprint"])).steps(
        "dualmem", "Sophie_Dubois"
    )
    ingested, answered = steps.count("ingest"), steps.count("record")
    assert (
        1 <= ingested < 5 and answered >= 1 and not (tmp_path / "run" / "summary.json").exists()
    )  # killed mid-persona

    with OpenAIStandin(latency_s=0.0) as second:
        output = finish(_cli(sophie_prefix, tmp_path / "run", second.base_url))
    assert "resuming run" in output
    assert answered_before + len(second.calls) == total  # no model call made twice across the two runs
    assert _stable(read_records(tmp_path / "run" / "records.jsonl")) == _stable(
        read_records(tmp_path / "clean" / "records.jsonl")
    )
    assert read_run(tmp_path / "run")["segments"].__len__() == 2


@pytest.fixture
def sample_data(tmp_path):
    base = load_sample()
    items = []
    for name in ("a-first", "b-second"):
        item = base.model_copy(deep=True)
        item.dialogue.id = name
        items.append(item)
    return dump_rolememo(Dataset(name="rolememo", items=items), tmp_path / "data")


def _turn_log(name, item, ctx):
    return TurnLogFramework(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical")


def test_the_default_run_folder_is_deterministic_and_a_folder_of_another_run_is_refused(
    sample_data, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    common = dict(
        similarity=HashEmbeddings(64), framework_factory=_turn_log, progress=False, respond=False, ragas=False
    )
    a = run_eval("rolememo", sample_data, "turn-log", settings=Settings(embedder="hash:64"), **common)
    b = run_eval("rolememo", sample_data, "turn-log", settings=Settings(embedder="hash:64", concurrency=1), **common)
    assert (
        a == b and a.parent.name == "runs" and a.name.startswith("rolememo-turn-log-")
    )  # concurrency changes no result
    assert len(read_run(a)["segments"]) == 2
    c = run_eval("rolememo", sample_data, "turn-log", settings=Settings(embedder="hash:64", retrieval_k=5), **common)
    assert c != a  # another setting, another run
    with pytest.raises(ConfigurationError, match=r"retrieval_k: 10 -> 5.*--resume"):
        run_eval(
            "rolememo", sample_data, "turn-log", settings=Settings(embedder="hash:64", retrieval_k=5), out=a, **common
        )
    summary = json.loads((a / "summary.json").read_text())
    assert summary["meta"]["settings"]["retrieval_k"] == 10 and "openai_api_key" not in summary["meta"]["settings"]
    assert "openai_api_key" not in (a / "run.json").read_text()


def test_resume_reads_the_command_from_the_run_folder(sample_data, tmp_path):
    run = run_eval(
        "rolememo",
        sample_data,
        "full-context",
        out=tmp_path / "run",
        progress=False,
        respond=False,
        ragas=False,
        settings=Settings(embedder="hash:64", store_uri=str(tmp_path / "db"), context_tokens=500),
    )
    first = read_records(run / "records.jsonl")
    again = resume_eval(run, settings={"concurrency": 1}, progress=False)
    assert again == run and read_records(run / "records.jsonl") == first
    with pytest.raises(ConfigurationError, match="context_tokens"):
        resume_eval(run, settings={"context_tokens": 900})
    with pytest.raises(ConfigurationError, match="run.json"):
        resume_eval(tmp_path)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text("{}")  # a folder of an older dualmem: memory without a journal
    with pytest.raises(ConfigurationError, match="not empty and holds no run.json"):
        run_eval(
            "rolememo",
            sample_data,
            "full-context",
            out=tmp_path / "old",
            progress=False,
            respond=False,
            ragas=False,
            settings=Settings(embedder="hash:64"),
        )


WRITERS: list[str] = []


class WriterProbe(TurnLogFramework):
    """Raw turns; notes which model its context would write with (the context evals/unit.py builds)."""

    uses_writer = True

    def __init__(self, context: FrameworkContext) -> None:
        WRITERS.append(context.writer().name_)
        super().__init__(context, ranking="lexical")


def test_a_run_begun_when_the_chat_model_wrote_resumes_with_it_writing(sample_data, tmp_path, monkeypatch):
    """local:smollm2 now writes with its adapter: a run recorded before that (no ``writer`` in its spec) is another run for
    the same command, and --resume goes on with the chat model writing, as the run began."""
    from dualmem.frameworks import REGISTRY

    monkeypatch.setitem(REGISTRY, "writer-probe", f"{__name__}:WriterProbe")
    WRITERS.clear()
    common = dict(similarity=HashEmbeddings(64), progress=False, respond=False, ragas=False)
    settings = Settings(embedder="hash:64", chat_model="local:smollm2", writer_model="", local_engine="transformers")
    run = run_eval("rolememo", sample_data, "writer-probe", out=tmp_path / "run", settings=settings, **common)
    data = json.loads((run / "run.json").read_text())
    assert data["spec"]["writer"] == "local:smollm2-writer" and set(WRITERS) == {"smollm2-writer"}
    # as an older dualmem recorded it: no writer field, the fingerprint of what it had
    del data["spec"]["writer"]
    from dualmem.evals.runspec import RunSpec, fingerprint

    data["fingerprint"] = fingerprint(RunSpec(**data["spec"]))
    (run / "run.json").write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match=r"writer: None -> 'local:smollm2-writer'.*--resume"):
        run_eval("rolememo", sample_data, "writer-probe", out=run, settings=settings, **common)
    WRITERS.clear()
    assert resume_eval(run, progress=False) == run
    assert WRITERS and set(WRITERS) == {"smollm2"}  # the chat model goes on writing
    assert "writer" not in json.loads((run / "run.json").read_text())["spec"]
    # a framework that never writes with the writer model records no writer
    plain = run_eval("rolememo", sample_data, "full-context", out=tmp_path / "plain", settings=settings, **common)
    assert json.loads((plain / "run.json").read_text())["spec"]["writer"] is None


def test_the_writer_of_a_framework_context():
    from dualmem.testing import FakeChatModel

    default = Settings(chat_model="local:smollm2", writer_model="", local_engine="transformers")
    assert FrameworkContext(namespace=("p", "u"), settings=default).writer().name_ == "smollm2-writer"
    chat = FakeChatModel()
    assert (
        FrameworkContext(namespace=("p", "u"), settings=default, chat_model=chat).writer() is chat
    )  # a given chat model writes
    base = default.replace(writer_model="local:smollm2")
    assert FrameworkContext(namespace=("p", "u"), settings=base).writer().name_ == "smollm2"
    other = Settings(chat_model="fake:memory", writer_model="")
    ctx = FrameworkContext(namespace=("p", "u"), settings=other)
    assert ctx.writer() is ctx.chat()
