"""What memory costs: every model call of a run counted per phase, equal to what the endpoint logged, once across a resume."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
from pathlib import Path

import pytest
from fixtures.eval_cli import eval_cli, finish
from fixtures.standin import OpenAIStandin
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda

from dualmem.config import Settings
from dualmem.datasets import load_dataset, sample_path
from dualmem.errors import ConfigurationError
from dualmem.evals.cost import Meter, cost_summary, price_table
from dualmem.evals.ingest import ingest_histories, plan_histories
from dualmem.evals.runspec import read_run
from dualmem.evaluate import compare, run_eval
from dualmem.models import RemoteEmbeddings
from dualmem.models.retry import RetryPolicy, invoke_with_retry
from dualmem.models.tokens import count_tokens
from dualmem.testing import FakeChatModel, HashEmbeddings

PHASE_OF = {
    "MemoryUpdate": "writing",
    None: "answering",
    "RolePlayVerdict": "judging",
}  # what each request the stand-in logs is


def _logged(calls: list[dict]) -> dict[str, dict[str, int]]:
    """Return the endpoint's log per phase: requests, prompt and completion tokens."""
    out: dict[str, dict[str, int]] = {}
    for call in calls:
        assert call["schema"] in PHASE_OF, f"a request the test does not place: {call['schema']}"
        row = out.setdefault(PHASE_OF[call["schema"]], {"calls": 0, "input_tokens": 0, "output_tokens": 0})
        row["calls"] += 1
        row["input_tokens"] += call["usage"]["prompt_tokens"]
        row["output_tokens"] += call["usage"]["completion_tokens"]
    return out


def _counted(summary: dict) -> dict[str, dict[str, int]]:
    return {
        name: {k: row[k] for k in ("calls", "input_tokens", "output_tokens")}
        for name, row in summary["cost"]["phases"].items()
        if row["calls"]
    }


@pytest.fixture(scope="module")
def standin_run(tmp_path_factory):
    """The dualmem framework on the bundled sample, writer, reader and judge all the stand-in (0.05 s per call)."""
    out = tmp_path_factory.mktemp("cost") / "run"
    with OpenAIStandin(latency_s=0.05) as server:
        settings = Settings(
            embedder="hash:64",
            openai_base_url=server.base_url,
            openai_api_key="sk-secret",
            judge_repetitions=1,
            prices="standin=1/2",
        )
        run = run_eval(
            "rolememo",
            sample_path(),
            "dualmem",
            out=out,
            model="openai-compatible:standin",
            judge="openai-compatible:standin",
            settings=settings,
            progress=False,
            ragas=False,
        )
    return run, server.calls, json.loads((run / "summary.json").read_text())


def test_the_summary_counts_per_phase_what_the_endpoint_logged(standin_run):
    run, calls, summary = standin_run
    logged = _logged(calls)
    assert (
        set(logged) == {"writing", "answering", "judging"} and logged["judging"]["calls"] == 3 * 4
    )  # 3 queries x 4 dimensions
    assert _counted(summary) == logged
    cost = summary["cost"]
    assert cost["phases"]["retrieval"]["calls"] == 0  # dualmem retrieves without a model
    assert cost["total"]["counted_tokens"] == 0  # every figure came from the endpoint's usage
    assert cost["total"]["calls"] == len(calls) and cost["total"]["retries"] == cost["total"]["failed"] == 0
    assert cost["total"]["seconds"] >= 0.05 * len(calls)  # the latency of each call is in it
    assert cost["per_persona"]["sample-mara-theo"]["writing"]["calls"] == logged["writing"]["calls"]
    assert cost["writer_input_per_history_token"] == round(
        logged["writing"]["input_tokens"] / cost["history_tokens"], 3
    )
    assert cost["tokens_per_query"] == round(
        sum(r["input_tokens"] + r["output_tokens"] for r in logged.values()) / 3, 1
    )
    spent = sum(r["input_tokens"] * 1 + r["output_tokens"] * 2 for r in logged.values()) / 1e6
    assert cost["money"]["total"] == pytest.approx(spent) and cost["money"]["unpriced"] == []
    report = (run / "report.md").read_text()
    assert "## Cost" in report and "writer input" in report and "Quality versus tokens" in report


def test_the_run_records_what_re_running_it_needs_and_no_key(standin_run):
    run, _calls, summary = standin_run
    rep = summary["meta"]["reproducibility"]
    assert rep["versions"]["dualmem"] and rep["versions"]["langchain-core"] and rep["versions"]["python"]
    assert rep["dataset"]["sha256"] == hashlib.sha256(sample_path().read_bytes()).hexdigest()
    assert rep["models"]["chat"] == rep["models"]["judge"] == "openai-compatible:standin"
    assert rep["endpoint"].startswith("http://127.0.0.1:") and set(rep["prompts"]) >= {"judges", "writer", "respond"}
    assert "temperature" in rep["seeds"]
    for name in ("summary.json", "run.json", "report.md", "report.html"):
        assert "sk-secret" not in (run / name).read_text()


def test_a_run_killed_mid_persona_and_resumed_counts_each_call_once(tmp_path):
    data = tmp_path / "sample.json"
    shutil.copyfile(sample_path(), data)
    env = {"DUALMEM_JUDGE_REPETITIONS": "1"}
    with OpenAIStandin(latency_s=0.0) as clean:
        finish(eval_cli(data, tmp_path / "clean", clean.base_url, dataset="rolememo", env=env))
    answers = [c["n"] for c in sorted(clean.calls, key=lambda c: c["n"]) if c["schema"] is None]
    with OpenAIStandin(latency_s=0.0, hold_at=answers[1]) as first:  # killed asking the second question: memory written
        proc = eval_cli(data, tmp_path / "run", first.base_url, dataset="rolememo", env=env)
        assert first.wait_held(timeout=240), "the run never reached the call where it is killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        first.abandon()
    assert [c["schema"] for c in first.calls].count(None) == 1 and not (tmp_path / "run" / "summary.json").exists()
    with OpenAIStandin(latency_s=0.0) as second:
        assert "resuming run" in finish(eval_cli(data, tmp_path / "run", second.base_url, dataset="rolememo", env=env))
    assert len(read_run(tmp_path / "run")["segments"]) == 2
    resumed = json.loads((tmp_path / "run" / "summary.json").read_text())
    whole = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert _counted(resumed) == _logged(first.calls + second.calls) == _logged(clean.calls) == _counted(whole)
    assert second.calls and all(c["schema"] != "MemoryUpdate" for c in second.calls)  # the memory was not written again


def test_calls_without_usage_figures_are_counted_with_the_token_counter(tmp_path):
    with OpenAIStandin(latency_s=0.0, usage=False) as server:
        run = run_eval(
            "rolememo",
            sample_path(),
            "dualmem",
            out=tmp_path / "run",
            model="openai-compatible:standin",
            settings=Settings(embedder="hash:64", openai_base_url=server.base_url, openai_api_key="x"),
            progress=False,
            ragas=False,
        )
    cost = json.loads((run / "summary.json").read_text())["cost"]
    assert cost["total"]["calls"] == len(server.calls) and cost["phases"]["judging"]["calls"] == 0
    assert cost["total"]["counted_tokens"] == cost["total"]["input_tokens"] + cost["total"]["output_tokens"] > 1000


def _structured(answer: AIMessage):
    """A structured output that is no chat model (the bundled model's grammar path): the include_raw dict."""
    return RunnableLambda(lambda _: {"raw": answer, "parsed": {"facts": [], "insights": []}, "parsing_error": None})


def test_a_structured_output_that_is_no_chat_model_counts_its_message_not_its_repr():
    prompt = [SystemMessage("You write memory."), HumanMessage("Theo climbs on Thursdays.")]
    text = '{"facts": [], "insights": []}'
    meter = Meter()
    with meter.counting("writing"):
        usage = {"input_tokens": 41, "output_tokens": 9, "total_tokens": 50}
        invoke_with_retry(
            _structured(AIMessage(text, usage_metadata=usage)),
            prompt,
            policy=RetryPolicy(retries=0, backoff=0.0, max_wait=1.0),
        )
    row = meter.phases()["writing"]
    assert (row["calls"], row["input_tokens"], row["output_tokens"], row["counted_tokens"]) == (1, 41, 9, 0)
    meter = Meter()
    with meter.counting("writing"):  # no usage on the message: its text and the prompt's texts are counted
        invoke_with_retry(
            _structured(AIMessage(text)), prompt, policy=RetryPolicy(retries=0, backoff=0.0, max_wait=1.0)
        )
    row = meter.phases()["writing"]
    assert row["output_tokens"] == count_tokens(text)
    assert row["input_tokens"] == count_tokens("You write memory.\nTheo climbs on Thursdays.")


def test_the_bundled_models_structured_output_is_a_chat_model_call_that_callbacks_hear(monkeypatch):
    """LangChain's own usage callback, tracing and the meter hear the bundled model's structured answers."""
    from langchain_core.callbacks import get_usage_metadata_callback

    from dualmem.models.local.bundled import usage
    from dualmem.models.local.model import LocalChatModel
    from dualmem.schema import MemoryUpdate

    asked: list[str | None] = []

    def fake_run(self, messages, stop=None, schema_json=None):  # the engine: no weights loaded
        asked.append(schema_json)
        return '{"facts": [], "insights": []}', usage(590, 24)

    monkeypatch.setattr(LocalChatModel, "_run", fake_run)
    structured = LocalChatModel().with_structured_output(MemoryUpdate, include_raw=True)
    with get_usage_metadata_callback() as heard:
        out = structured.invoke("Theo climbs on Thursdays.")
    assert out["parsed"] == MemoryUpdate() and out["parsing_error"] is None
    assert json.loads(asked[0] or "{}")["title"] == "MemoryUpdate"  # decoded under the schema
    assert [(u["input_tokens"], u["output_tokens"]) for u in heard.usage_metadata.values()] == [(590, 24)]
    meter = Meter()
    with meter.counting("writing"):
        invoke_with_retry(structured, "Theo", policy=RetryPolicy(retries=0, backoff=0.0, max_wait=1.0))
    row = meter.phases()["writing"]
    assert (row["calls"], row["input_tokens"], row["output_tokens"], row["counted_tokens"]) == (1, 590, 24, 0)
    assert list(row["models"]) == [LocalChatModel().model_name]  # named by the model, not by the runnable around it


class RateLimited(Exception):
    status_code = 429


def test_a_retried_call_counts_its_failed_attempt_and_the_retry():
    model = FakeChatModel(responses=[RateLimited("slow down"), "fine, thanks"])
    meter = Meter()
    with meter.counting("answering"):
        invoke_with_retry(model, "how are you?", policy=RetryPolicy(retries=2, backoff=0.0, max_wait=1.0))
    row = meter.phases()["answering"]
    assert (row["calls"], row["retries"], row["failed"]) == (2, 1, 1)
    assert row["output_tokens"] == count_tokens("fine, thanks") and row["models"]["dualmem-fake"]["calls"] == 2


def test_a_provider_embedder_call_is_counted_and_no_call_outside_a_meter():
    embedder = RemoteEmbeddings(HashEmbeddings(8))
    texts = ["Theo climbs on Thursdays", "Mara was a night-shift nurse"]
    embedder.embed_documents(texts)  # no meter: nothing to count it
    meter = Meter()
    with meter.counting("retrieval"):
        embedder.embed_documents(texts)
        embedder.embed_query("who climbs?")
    row = meter.phases()["retrieval"]
    assert (row["embedding_calls"], row["chat_calls"]) == (2, 0)
    assert row["input_tokens"] == sum(count_tokens(t) for t in texts) + count_tokens("who climbs?")


def test_ingest_reports_the_writer_cost_of_a_history(tmp_path):
    settings = Settings(chat_model="fake:memory", embedder="hash:64", store_uri=str(tmp_path / "db"))
    report = ingest_histories(
        plan_histories(load_dataset("rolememo", sample_path()), settings), settings, progress=False
    )[0]
    writing = report.cost["phases"]["writing"]
    assert writing["calls"] == report.llm_calls == len(report.chunks) and writing["input_tokens"] > 0
    assert report.cost["writer_input_per_history_token"] == round(
        writing["input_tokens"] / report.cost["history_tokens"], 3
    )
    again = ingest_histories(
        plan_histories(load_dataset("rolememo", sample_path()), settings), settings, progress=False
    )[0]
    assert again.cost["total"]["calls"] == 0 and again.cost["history_tokens"] == 0  # nothing left to write


def test_compare_shows_what_each_run_cost(standin_run, tmp_path):
    run, _calls, summary = standin_run
    cheap = tmp_path / "cheap"
    shutil.copytree(run, cheap)
    data = json.loads((cheap / "summary.json").read_text())
    data["cost"] = cost_summary(
        {"p": {"phases": {"answering": {"calls": 3, "input_tokens": 30, "output_tokens": 0}}}}, 3
    )
    (cheap / "summary.json").write_text(json.dumps(data))
    markdown = compare([run, cheap])
    assert "Quality versus tokens" in markdown
    table = [x for x in markdown.split("Quality versus tokens")[1].splitlines() if x.startswith("| ")][
        1:
    ]  # rows, no header
    assert "| 10 | 1.000 |" in next(x for x in table if x.startswith("| cheap"))  # 30 tokens and 3 calls over 3 queries
    assert f"| {round(summary['cost']['tokens_per_query'])} |" in next(x for x in table if x.startswith("| run"))


def test_a_malformed_price_table_is_one_line_naming_the_form():
    assert price_table("gpt-4o-mini=0.15/0.6,*=2") == {"gpt-4o-mini": (0.15, 0.6), "*": (2.0, 2.0)}
    with pytest.raises(ConfigurationError, match="MODEL=IN/OUT"):
        price_table("gpt-4o-mini:0.15")
    with pytest.raises(ConfigurationError, match="MODEL=IN/OUT"):
        run_eval(
            "rolememo", sample_path(), "raw-turns", out=Path("/nonexistent/never"), settings=Settings(prices="x=y")
        )
