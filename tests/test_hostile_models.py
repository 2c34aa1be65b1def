"""Failing models against a real OpenAI-compatible server on loopback: retries, Retry-After, recorded failures."""

from __future__ import annotations

import json
import re
import time

import pytest
from fixtures.endpoint import Endpoint, closed_port_url
from langchain_core.messages import HumanMessage

from dualmem.config import Settings
from dualmem.errors import ConfigurationError, ModelCallError
from dualmem.models import load_chat_model
from dualmem.models.retry import RetryPolicy, invoke_with_retry, next_wait, retry_after
from dualmem.models.structured import invoke_structured
from dualmem.schema import MemoryUpdate, Persona, Session, Turn
from dualmem.stores import LanceDualStore
from dualmem.testing import HashEmbeddings
from dualmem.writer import write_history

PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist")
NS = ("dr-lee", "user")


def memory_answer(body) -> str:
    """Answer a writer prompt with one fact about the chunk's first user turn."""
    prompt = body["messages"][-1]["content"]
    turn = re.search(r"^\[([^\]]+)\] User", prompt, re.M).group(1)
    return json.dumps(
        {
            "facts": [{"op": "ADD", "id": "N1", "text": f"the user talked about {turn}", "turn_ids": [turn]}],
            "insights": [],
        }
    )


def _settings(tmp_path, url, **kw):
    base = dict(
        store_uri=str(tmp_path / "db"),
        checkpoint_path=str(tmp_path / "ck.sqlite"),
        embedder="hash:64",
        chat_model="vllm:test-model",
        openai_base_url=url,
        retry_backoff=0.01,
        chunk_tokens=40,
    )
    return Settings(**{**base, **kw})


def _sessions(n: int) -> list[Session]:
    return [
        Session(
            id=f"s{i}",
            time="2024-01-01",
            turns=[Turn(id=f"s{i}t0", role="user", text=f"topic{i} happened today at work")],
        )
        for i in range(n)
    ]


def test_429_with_retry_after_is_waited_for_then_succeeds(tmp_path):
    with Endpoint(lambda body: '{"facts": [], "insights": []}') as server:
        server.script = [("status", 429, {"Retry-After": "1"}), ("ok", None)]
        settings = _settings(tmp_path, server.base_url)
        started = time.monotonic()
        out = invoke_structured(
            load_chat_model(None, settings), [HumanMessage(content="hi")], MemoryUpdate, policy=settings
        )
        (first, _, code), (second, _, ok) = server.calls()
    assert out.ok and out.attempts == 2 and not out.call_failed
    assert code == "429" and ok == "ok" and second - first >= 0.95  # the server asked for 1 s; backoff alone is 0.01 s
    assert time.monotonic() - started >= 0.95


def test_5xx_timeouts_and_dropped_connections_are_retried(tmp_path):
    with Endpoint(lambda body: '{"facts": [], "insights": []}') as server:
        server.script = [("status", 503), ("sleep", 2.0), ("drop",), ("status", 500), ("ok", None)]
        settings = _settings(tmp_path, server.base_url, request_timeout=0.5)
        out = invoke_structured(
            load_chat_model(None, settings), [HumanMessage(content="hi")], MemoryUpdate, policy=settings
        )
        outcomes = [o for _, _, o in server.calls()]
    assert out.ok and out.attempts == 5
    assert outcomes == ["503", "sleep", "drop", "500", "ok"]


def test_a_call_failing_past_its_retries_is_a_recorded_failure_not_a_crash(tmp_path):
    with Endpoint() as server:
        server.script = [("status", 502)]
        settings = _settings(tmp_path, server.base_url, call_retries=2)
        out = invoke_structured(
            load_chat_model(None, settings), [HumanMessage(content="hi")], MemoryUpdate, policy=settings
        )
        assert len(server.calls()) == 3
    assert out.value is None and out.call_failed and out.attempts == 3
    assert "HTTP 502" in out.error and "after 3 attempts" in out.error


def test_a_connection_refused_mid_run_is_retried_then_recorded_as_a_failure(tmp_path):
    """The endpoint goes away after the run started (preflight passed): each call is retried, then recorded failed."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = _settings(tmp_path, f"http://127.0.0.1:{port}/v1", call_retries=2, retry_backoff=0.05)
    started = time.monotonic()
    out = invoke_structured(
        load_chat_model(None, settings), [HumanMessage(content="hi")], MemoryUpdate, policy=settings
    )
    assert out.value is None and out.call_failed and out.attempts == 3
    assert "connect" in out.error.lower() and "after 3 attempts" in out.error
    assert time.monotonic() - started < 30


def test_a_retry_after_longer_than_retry_max_wait_fails_at_once(tmp_path):
    with Endpoint() as server:
        server.script = [("status", 429, {"Retry-After": "3600"})]
        settings = _settings(tmp_path, server.base_url, retry_max_wait=5)
        started = time.monotonic()
        with pytest.raises(ModelCallError, match="asked to wait 3600 s"):
            invoke_with_retry(load_chat_model(None, settings), [HumanMessage(content="hi")], policy=settings)
        assert time.monotonic() - started < 3 and len(server.calls()) == 1


def test_rejected_credentials_stop_the_run_with_the_fix(tmp_path):
    with Endpoint() as server:
        server.script = [("status", 401)]
        settings = _settings(tmp_path, server.base_url)
        with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
            invoke_structured(
                load_chat_model(None, settings), [HumanMessage(content="hi")], MemoryUpdate, policy=settings
            )
        assert len(server.calls()) == 1  # not retried: every later call would fail the same way


def test_retry_after_forms_and_backoff():
    import httpx

    def err(headers):
        response = httpx.Response(429, headers=headers, request=httpx.Request("POST", "http://x"))
        return httpx.HTTPStatusError("429", request=response.request, response=response)

    assert retry_after(err({"retry-after-ms": "1500"})) == 1.5
    assert retry_after(err({"Retry-After": "7"})) == 7.0
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= retry_after(err({"Retry-After": date})) <= 31
    assert retry_after(err({})) is None
    policy = RetryPolicy(retries=5, backoff=1.0, max_wait=10.0)
    waits = [next_wait(policy, n, err({})) for n in (1, 2, 3, 4, 5)]
    assert all(
        0.5 * min(10, 2 ** (n - 1)) <= w <= min(10, 2 ** (n - 1)) for n, w in zip((1, 2, 3, 4, 5), waits, strict=True)
    )
    assert next_wait(policy, 1, err({"Retry-After": "4"})) >= 4.0
    with pytest.raises(ModelCallError, match="after 6 attempts"):
        next_wait(policy, 6, err({}))


def test_a_chunk_whose_model_call_fails_is_recorded_and_the_run_goes_on(tmp_path):
    with Endpoint(memory_answer) as server:
        # chunk 1 ok; chunk 2 fails on every retry; chunk 3 ok
        server.script = [("ok", None), ("status", 500), ("status", 500), ("status", 500), ("ok", None)]
        settings = _settings(tmp_path, server.base_url, call_retries=2)
        store = LanceDualStore(settings.store_uri, HashEmbeddings(64))
        report = write_history(_sessions(3), PERSONA, settings=settings, store=store, progress=False, thread_id="t")
        assert [r["status"] for r in report.chunks] == ["applied", "failed", "applied"]
        (failed,) = report.failed_chunks
        assert "HTTP 500" in failed["error"] and failed["attempts"] == 3
        assert store.count(NS, kind="fact") == 2
        server.script = [("ok", None)]  # the endpoint recovers: re-running redoes only the failed chunk
        again = write_history(_sessions(3), PERSONA, settings=settings, store=store, progress=False, thread_id="t")
        assert [r["status"] for r in again.chunks] == ["skipped", "applied", "skipped"] and not again.failed_chunks
        assert store.count(NS, kind="fact") == 3


def test_the_endpoint_is_checked_once_before_any_chunk(tmp_path):
    settings = _settings(tmp_path, closed_port_url(), call_retries=0)
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"cannot reach the model endpoint .*refused.*OPENAI_BASE_URL"):
        write_history(
            _sessions(50),
            PERSONA,
            settings=settings,
            store=LanceDualStore(settings.store_uri, HashEmbeddings(64)),
            progress=False,
        )
    assert time.monotonic() - started < 10
    with Endpoint(memory_answer, models=("another-model",)) as server:
        with pytest.raises(ConfigurationError, match=r"'test-model' is not served .* it serves: another-model"):
            write_history(_sessions(1), PERSONA, settings=_settings(tmp_path, server.base_url), progress=False)
        assert server.calls() == []  # no chunk was sent


def test_a_judge_whose_model_fails_records_an_error_per_repetition(tmp_path):
    from dualmem.evals.judges import locomo_correctness_judge

    with Endpoint(lambda body: '{"reasoning": "fine", "score": 1}') as server:
        server.script = [("status", 503), ("status", 503), ("ok", None)]
        settings = _settings(tmp_path, server.base_url, call_retries=1)
        judge = locomo_correctness_judge(load_chat_model(None, settings), settings=settings, repetitions=2)
        result = judge({"question": "q"}, {"answer": "a"}, {"answer": "a"})
    assert result["extra"]["repetitions"] == [None, 1]
    assert result["score"] == 1.0 and "judge model call failed after 2 attempts" in result["extra"]["errors"][0]


def test_a_baseline_records_failed_model_calls_and_goes_on(tmp_path):
    from dualmem.frameworks import FrameworkContext, open_framework

    with Endpoint(lambda body: "The user talks about work.") as server:
        server.script = [("status", 500)] * 3 + [("ok", None)]
        settings = _settings(tmp_path, server.base_url, call_retries=2, chunk_tokens=20)
        ctx = FrameworkContext(
            namespace=NS,
            settings=settings,
            persona=PERSONA,
            chat_model=load_chat_model(None, settings),
            embeddings=HashEmbeddings(64),
            store_uri=settings.store_uri,
        )
        report = open_framework("memagent", ctx).ingest(
            Session(id="s0", turns=[Turn(id=f"t{i}", role="user", text=f"word{i} " * 15) for i in range(3)])
        )
    assert len(report.failed_chunks) == 1 and "HTTP 500" in report.meta["errors"][report.failed_chunks[0]]
    assert report.items_written or report.llm_calls > 1  # the later chunks were written


def test_a_generator_records_a_failed_call_as_the_item_rejection(tmp_path):
    from dualmem.context import context_of
    from dualmem.generators.weave import QuerySeed, check_necessity

    with Endpoint() as server:
        server.script = [("status", 503)]
        settings = _settings(tmp_path, server.base_url, call_retries=1)
        res = context_of(settings, models={"chat": load_chat_model(None, settings)})
        kept, reason, _ = check_necessity(
            res, PERSONA, {"text": "an insight"}, QuerySeed(fragment_1="a b", fragment_2="c d", question="q?")
        )
    assert not kept and reason.startswith("necessity:") and "HTTP 503" in reason
