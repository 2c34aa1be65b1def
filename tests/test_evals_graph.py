"""The evaluate graph through run_eval: fan-out per persona, resume after a crash, reports, comparison."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import REALMEM_SOPHIE, need

from dualmem.config import Settings
from dualmem.context import context_of
from dualmem.datasets import dump_realmem, dump_rolememo, load_realmem, load_sample
from dualmem.errors import ConfigurationError
from dualmem.evals.compare import compare_runs
from dualmem.evals.fakes import TurnLogFramework
from dualmem.evals.record import RunRecord
from dualmem.evals.reports import read_records, read_summary
from dualmem.evals.unit import EvalRun, InProcess, JudgePlan, UnitEnv
from dualmem.evaluate import compare, run_eval
from dualmem.frameworks import FrameworkContext
from dualmem.graphs.evaluate import builder, graph
from dualmem.schema import Dataset
from dualmem.testing import FakeChatModel, HashEmbeddings


@pytest.fixture
def three_personas(tmp_path):
    base = load_sample()
    items = []
    for name in ("a-first", "b-crash", "c-last"):
        item = base.model_copy(deep=True)
        item.dialogue.id = name
        items.append(item)
    return dump_rolememo(Dataset(name="rolememo", items=items), tmp_path / "data")


def in_process(tmp_path, framework: str = "turn-log", **env) -> EvalRun:
    """Return the run resources of a graph invoked directly: units in this process, a record in ``tmp_path``."""
    unit_env = UnitEnv(
        settings=Settings(embedder="hash:64"),
        records={framework: RunRecord(str(tmp_path / "record"))},
        stores={framework: str(tmp_path / "db")},
        **env,
    )
    return EvalRun(env=unit_env, runner=InProcess(unit_env))


class Factory:
    """Builds TurnLogFrameworks, counting builds per persona and keeping them; can crash on one persona once."""

    def __init__(self, crash_on: str | None = None) -> None:
        self.crash_on = crash_on
        self.built: Counter[str] = Counter()
        self.made: list[TurnLogFramework] = []

    def __call__(self, name, item, ctx):
        self.built[item.dialogue.id] += 1
        if item.dialogue.id == self.crash_on:
            self.crash_on = None
            raise RuntimeError("simulated crash")
        self.made.append(TurnLogFramework(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical"))
        return self.made[-1]

    def work(self, start: int = 0) -> tuple[int, int]:
        """Return (sessions ingested, queries retrieved) by the frameworks built since ``start``."""
        return sum(len(f.ingested) for f in self.made[start:]), sum(len(f.queries) for f in self.made[start:])


def test_run_eval_resumes_after_a_crash_without_recomputing(three_personas, tmp_path):
    settings = Settings(embedder="hash:64", concurrency=1, judge_repetitions=1)
    factory = Factory(crash_on="b-crash")
    kwargs = dict(
        out=tmp_path / "run",
        settings=settings,
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        progress=False,
        judge=FakeChatModel(responses=[{"reasoning": "", "score": 4}], cycle=True),
        ragas=False,
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_eval("rolememo", three_personas, "turn-log", **kwargs)
    assert factory.built["a-first"] == 1 and factory.built["b-crash"] == 1
    first = len(factory.made)
    before = factory.work()
    run_dir = run_eval("rolememo", three_personas, "turn-log", **kwargs)
    # the finished personas come back from the journal; only b-crash ingests and answers (4 sessions, 3 queries, with respond)
    sessions, queries = factory.work(first)
    assert sessions == 4 and queries == 3 * 2 and before[0] + sessions == 3 * 4
    records = read_records(run_dir / "records.jsonl")
    assert sorted({r["persona"] for r in records}) == ["a-first", "b-crash", "c-last"]
    assert len(records) == 9 and all(r["judges"]["logical_quality"]["score"] == 4.0 for r in records)
    summary = read_summary(run_dir)
    assert summary["n_queries"] == 9 and summary["meta"]["framework"] == "turn-log"
    assert summary["meta"]["similarity_embedder"] == "HashEmbeddings"
    assert set(summary["by_task_type"]) == {r["task_type"] for r in records}
    assert summary["judges"]["information_richness"]["mean"] == 4.0
    html = (run_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and 'id="judge_radar"' in html and 'id="recall_by_group"' in html
    assert "fact_recall@10" in (run_dir / "report.md").read_text()
    # a finished run is re-reported, not recomputed
    judged = len(kwargs["judge"].calls)
    again = len(factory.made)
    run_eval("rolememo", three_personas, "turn-log", **kwargs)
    assert factory.work(again) == (0, 0) and len(kwargs["judge"].calls) == judged
    assert read_records(run_dir / "records.jsonl") == records


def test_realmem_graph_run_with_limit_and_comparison(tmp_path):
    item = load_realmem(need(REALMEM_SOPHIE), limit_sessions=8).items[0]
    path = dump_realmem(item, path=tmp_path / "Sophie_Dubois_dialogues_test.json")
    factory = Factory()
    common = dict(
        settings=Settings(embedder="hash:64"),
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        progress=False,
        respond=False,
        limit=4,
    )
    a = run_eval("realmem", path, "turn-log", out=tmp_path / "a", **common)
    b = run_eval("realmem", path, "turn-log", out=tmp_path / "b", **common)
    summary = read_summary(a)
    assert summary["n_queries"] == 4 and "recall_any@10" in summary["overall"]
    assert summary["overall"] == summary["per_persona"]["Sophie_Dubois"]  # macro over one persona
    if summary["ragas"]["backend"].startswith("ragas"):
        assert summary["ragas"]["agrees_with_dualmem"] is True and summary["ragas"]["n"] == 4
        assert summary["ragas"]["id_context_recall"] == pytest.approx(summary["micro"]["id_context_recall"])
    table = compare_runs([a, b])
    headers, rows = table.headline_rows()
    assert headers[:4] == ["run", "framework", "dataset", "queries"]
    assert [row[0] for row in rows] == ["a", "b"] and rows[0][4:-1] == [c.split(" (")[0] for c in rows[1][4:-1]]
    assert all("(+0.000)" in c for c in rows[1][4:-1] if c != "–")  # same run twice: every delta is zero
    assert table.flips["b"] == {"gained": 0, "lost": 0, "same": 4, "paired": 4}
    md = compare([a, b], out=tmp_path / "cmp")
    assert "recall_any@10" in md and (tmp_path / "cmp" / "comparison.html").exists()
    with pytest.raises(ConfigurationError, match="summary.json"):
        compare([tmp_path])


def test_answers_are_ranked_with_the_same_context_as_the_scored_retrieval(tmp_path):
    """One retrieval path: the answer's memory is ranked with the query's own session turns, as the metrics' is."""
    item = load_realmem(need(REALMEM_SOPHIE), limit_sessions=8).items[0]
    path = dump_realmem(item, path=tmp_path / "Sophie_Dubois_dialogues_test.json")
    factory = Factory()
    run_eval(
        "realmem",
        path,
        "turn-log",
        out=tmp_path / "run",
        settings=Settings(embedder="hash:64"),
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        progress=False,
        respond=True,
        limit=3,
    )
    calls = [c for f in factory.made for c in f.contexts]
    assert len(calls) == 2 * 3  # retrieve, then respond's own retrieve, per query
    by_query: dict[str, list[list]] = {}
    for query, context in calls:
        by_query.setdefault(query, []).append([t.id for t in context])
    queries = {q.text: q for q in item.queries[:3]}
    for text, (scored, answered) in by_query.items():
        q = queries[text]
        session = next(s for s in item.dialogue.sessions if s.id == q.session_id)
        assert scored == answered == [t.id for t in session.turns[: q.turn_index]]
    assert any(scored for scored, _ in by_query.values())  # RealMem queries come after turns of their own session


def test_graph_is_exported_and_runs_with_a_context(three_personas, tmp_path):
    assert graph is not None and builder is not None
    ctx = context_of(
        {"embedder": "hash:64"}, run=in_process(tmp_path, similarity=HashEmbeddings(64), framework_factory=Factory())
    )
    out = graph.invoke(
        {
            "dataset_kind": "rolememo",
            "path": str(three_personas),
            "framework": "turn-log",
            "respond": False,
            "personas": ["c-last"],
        },
        context=ctx,
    )
    assert [r["persona"] for r in out["results"]] == ["c-last"]
    assert out["summary"]["n_queries"] == 3
    json.dumps(out["summary"])  # JSON-able


def test_fan_out_is_bounded_by_settings_concurrency(three_personas, tmp_path):
    import threading
    import time

    lock = threading.Lock()
    state = {"active": 0, "peak": 0}

    class Slow(TurnLogFramework):
        def ingest(self, session):
            with lock:
                state["active"] += 1
                state["peak"] = max(state["peak"], state["active"])
            time.sleep(0.03)
            with lock:
                state["active"] -= 1
            return super().ingest(session)

    def factory(name, item, ctx):
        return Slow(FrameworkContext(namespace=(item.dialogue.id, "u")))

    run_eval(
        "rolememo",
        three_personas,
        "slow",
        out=tmp_path / "run",
        settings=Settings(embedder="hash:64", concurrency=2),
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        progress=False,
        respond=False,
        ragas=False,
    )
    assert state["peak"] == 2  # three personas, two at a time


def test_graph_with_a_settings_dict_context_and_a_registered_framework(three_personas, tmp_path):
    out = graph.invoke(
        {
            "dataset_kind": "rolememo",
            "path": str(three_personas),
            "framework": "full-context",
            "respond": False,
            "personas": ["a-first"],
        },
        context={"options": {"embedder": "hash:64", "store_uri": str(tmp_path / "db")}},
    )
    records = out["results"][0]["records"]
    assert len(records) == 3 and not any(r["errors"] for r in records)
    assert all(r["retrieved"] and r["retrieved"][0]["session"] == "s4" for r in records)  # full context: newest first
    assert (tmp_path / "db" / "a-first").exists()  # each persona writes to its own store folder


def test_a_crash_while_judging_redoes_nothing_that_was_recorded(three_personas, tmp_path):
    from langgraph.checkpoint.memory import InMemorySaver

    made: list[TurnLogFramework] = []

    def factory(name, item, ctx):
        made.append(TurnLogFramework(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical"))
        return made[-1]

    judge = FakeChatModel(responses=[{"reasoning": "", "score": 3}], cycle=True)
    calls = {"n": 0}

    def crash_once(record):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("judge crashed")

    run = in_process(
        tmp_path,
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        on_judged=crash_once,
        judges={"turn-log": JudgePlan(judge, "dualmem-rolememo", "test")},
    )
    run.env.settings = Settings(embedder="hash:64", concurrency=1, judge_repetitions=1)
    ctx = context_of({"embedder": "hash:64", "concurrency": 1, "judge_repetitions": 1}, run=run)
    runnable = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "max_concurrency": 1}
    inputs = {
        "dataset_kind": "rolememo",
        "path": str(three_personas),
        "framework": "turn-log",
        "respond": True,
        "personas": ["a-first", "c-last"],
    }
    with pytest.raises(RuntimeError, match="judge crashed"):
        runnable.invoke(inputs, config, context=ctx)
    assert len(judge.calls) >= 2 * 4  # two answers judged (four dimensions, one repetition each) before the crash
    out = runnable.invoke(None, config, context=ctx)
    resumed = made[-1]
    assert resumed.ingested == [] and resumed.queries == []  # sessions and answers came back from the run record
    assert len(judge.calls) == 6 * 4  # every verdict asked once over both attempts
    assert out["summary"]["judges"]["logical_quality"] == {"mean": 3.0, "n": 6.0, "errors": 0.0}


def test_progress_goes_to_a_log_as_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    item = load_realmem(need(REALMEM_SOPHIE), limit_sessions=8).items[0]
    path = dump_realmem(item, path=tmp_path / "Sophie_Dubois_dialogues_test.json")
    run_eval(
        "realmem",
        path,
        "turn-log",
        out=tmp_path / "run",
        settings=Settings(embedder="hash:64"),
        similarity=HashEmbeddings(64),
        framework_factory=Factory(),
        respond=False,
        limit=4,
        ragas=False,
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": queries: " in line or "sessions ingested: " in line]
    assert any(line.endswith("queries: 4/4") for line in lines)  # the last step is always printed
    assert any(
        line.split()[0].count(":") == 2 and "sessions ingested: 1/" in line for line in lines
    )  # the first too, timed


def test_a_failed_call_is_asked_again_on_resume_and_a_finished_one_is_not(three_personas, tmp_path):
    attempts = {"respond": 0}

    class Flaky(TurnLogFramework):
        def respond(self, query, k=10, *, context=None):
            attempts["respond"] += 1
            if attempts["respond"] == 2:
                raise ConnectionError("endpoint down")
            return super().respond(query, k, context=context)

    def factory(name, item, ctx):
        return Flaky(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical")

    judge_calls = {"n": 0}

    def verdict(messages):
        judge_calls["n"] += 1
        if judge_calls["n"] == 1:
            raise TimeoutError("judge endpoint timed out")
        return {"reasoning": "", "score": 3}

    kwargs = dict(
        out=tmp_path / "run",
        settings=Settings(embedder="hash:64", concurrency=1, judge_repetitions=1, call_retries=0),
        similarity=HashEmbeddings(64),
        framework_factory=factory,
        progress=False,
        ragas=False,
        personas=["a-first"],
        judge=FakeChatModel(responses=[verdict], cycle=True),
    )
    first = read_records(run_eval("rolememo", three_personas, "turn-log", **kwargs) / "records.jsonl")
    assert [bool(r["errors"]) for r in first] == [True, True, False]  # q1: a verdict timed out; q2: no answer
    assert "respond failed: ConnectionError: endpoint down" in first[1]["errors"]
    assert first[0]["judges"]["information_richness"]["score"] is None and not first[1]["judges"]
    assert (attempts["respond"], judge_calls["n"]) == (3, 2 * 4)  # two answers judged on four dimensions
    second = read_records(run_eval("rolememo", three_personas, "turn-log", **kwargs) / "records.jsonl")
    assert not any(r["errors"] for r in second), [r["errors"] for r in second]
    assert all(v["score"] == 3 for r in second for v in r["judges"].values())
    # only what failed is asked again: q2's answer and its four verdicts, q1's one failed verdict
    assert (attempts["respond"], judge_calls["n"]) == (3 + 1, 8 + 4 + 1)
    assert second[0]["answer"] == first[0]["answer"] and second[2] == first[2]


def test_a_run_ranked_with_other_weights_is_another_run(three_personas, tmp_path):
    """The ranker's weights file is part of the run's fingerprint: edited weights never resume an old run."""
    import shutil

    from dualmem.retrieval.weights import shipped_path

    weights = tmp_path / "weights.json"
    shutil.copy(shipped_path(), weights)
    kwargs = dict(
        out=tmp_path / "run",
        settings=Settings(embedder="hash:64", ranker=str(weights)),
        similarity=HashEmbeddings(64),
        framework_factory=Factory(),
        progress=False,
        respond=False,
        ragas=False,
    )
    run_eval("rolememo", three_personas, "turn-log", **kwargs)
    run_eval("rolememo", three_personas, "turn-log", **kwargs)  # the same weights: the same run, continued
    data = json.loads(weights.read_text())
    data["cap_after"] = int(data.get("cap_after", 0)) + 1
    weights.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="ranker_weights"):
        run_eval("rolememo", three_personas, "turn-log", **kwargs)
