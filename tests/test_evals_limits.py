"""Endpoint limits: calls in flight and calls per minute, in one process (LocalGate) and for a cluster (SharedGate's
logic, without Ray); every model call through invoke_with_retry holds a slot per attempt, never during a backoff."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.models.limits import LocalGate, RateWindow, SharedGate, gate_for, install, slot
from dualmem.models.retry import RetryPolicy, ainvoke_with_retry, invoke_with_retry


def test_no_more_calls_in_flight_than_the_limit_from_many_threads():
    gate = LocalGate(concurrency=3)
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def call() -> None:
        with slot(gate):
            with lock:
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
            time.sleep(0.02)
            with lock:
                state["now"] -= 1

    threads = [threading.Thread(target=call) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["peak"] == gate.peak == 3 and gate.started == 12 and gate.in_flight == 0


def test_the_minute_window_holds_back_the_call_past_rpm():
    clock = {"t": 0.0}
    gate = LocalGate(concurrency=0, rpm=2, clock=lambda: clock["t"])
    gate.acquire()
    gate.release()
    clock["t"] = 30.0
    gate.acquire()
    gate.release()
    assert gate.window.wait_s(31.0) == pytest.approx(29.0)  # the third start waits for the first to leave the window
    assert RateWindow(0).wait_s(0.0) == 0.0  # no per-minute limit


def test_a_call_nested_in_a_call_takes_no_second_slot():
    gate = LocalGate(concurrency=1)
    with slot(gate), slot(gate):  # a second acquire of a 1-slot gate would wait forever
        assert gate.in_flight == 1


def test_every_attempt_holds_a_slot_and_a_backoff_holds_none():
    gate = LocalGate(concurrency=1)
    policy = RetryPolicy(retries=2, backoff=0.0, max_wait=1.0, gate=gate)
    seen = []

    def flaky(x: int) -> int:
        seen.append(gate.in_flight)
        if len(seen) < 3:
            raise ConnectionError("refused")
        return x

    slept = []
    assert invoke_with_retry(flaky, 7, policy=policy, sleep=lambda s: slept.append(gate.in_flight)) == 7
    assert seen == [1, 1, 1] and slept == [0, 0] and gate.started == 3
    assert asyncio.run(ainvoke_with_retry(lambda x: x + 1, 1, policy=policy)) == 2 and gate.in_flight == 0


def test_settings_give_one_gate_per_endpoint_and_an_installed_gate_wins():
    a = Settings(openai_base_url="http://a/v1", endpoint_concurrency=5)
    assert gate_for(a) is gate_for(a) is RetryPolicy.from_settings(a).gate
    assert gate_for(Settings(openai_base_url="http://b/v1", endpoint_concurrency=5)) is not gate_for(a)
    assert gate_for(Settings(endpoint_concurrency=0, endpoint_rpm=0)) is None
    mine = LocalGate(concurrency=1)
    install("http://a/v1", mine)
    try:
        assert gate_for(a) is mine
    finally:
        install("http://a/v1", None)
    with pytest.raises(ConfigurationError, match="endpoint_rpm"):
        Settings(endpoint_rpm=-1)


def test_the_shared_gate_waits_for_a_slot_and_takes_back_a_dead_holders_after_its_lease():
    async def scenario() -> tuple[float, float, dict]:
        gate = SharedGate(concurrency=1, rpm=0, lease_s=0.3)
        first = await gate.acquire()
        started = time.monotonic()
        second = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.05)
        await gate.release(first)
        await second
        freed = time.monotonic() - started
        started = time.monotonic()
        await gate.acquire()  # the holder of `second` never gives it back (its worker died): its lease ends
        expired = time.monotonic() - started
        return freed, expired, await gate.stats()

    freed, expired, stats = asyncio.run(scenario())
    assert freed < 0.2 and 0.2 < expired < 1.0
    assert stats == {"started": 3, "peak": 1, "in_flight": 1}


def test_the_shared_gate_keeps_the_minute_window():
    async def scenario() -> float:
        gate = SharedGate(concurrency=0, rpm=2, lease_s=60)
        for _ in range(2):
            await gate.release(await gate.acquire())
        gate.starts[0] -= 59.8  # the first start was almost a minute ago
        started = time.monotonic()
        await gate.acquire()
        return time.monotonic() - started

    assert 0.1 < asyncio.run(scenario()) < 1.0
