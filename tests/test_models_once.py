"""Many threads starting at once (an evaluation's first units) check an endpoint once and load the tokenizer once."""

from __future__ import annotations

import threading

from fixtures.endpoint import Endpoint

from dualmem.config import Settings
from dualmem.models import load_chat_model, tokens
from dualmem.preflight import check_model


def _together(n: int, work) -> None:
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_threads_checking_one_endpoint_at_once_send_one_request(tmp_path):
    with Endpoint() as server:
        settings = Settings(chat_model="vllm:test-model", openai_base_url=server.base_url, embedder="hash:64")
        model = load_chat_model(None, settings)
        _together(16, lambda: check_model(model, settings))
        assert len(server.calls("/v1/models")) == 1
        check_model(model, settings)
        assert len(server.calls("/v1/models")) == 1  # checked once per process


def test_threads_counting_tokens_at_once_load_the_tokenizer_once():
    tokens._load_tokenizer.cache_clear()
    counts: list[int] = []
    _together(16, lambda: counts.append(tokens.count_tokens("the user walked the dog along the canal")))
    assert tokens._load_tokenizer.cache_info().misses == 1
    assert len(set(counts)) == 1 and counts[0] > 5
