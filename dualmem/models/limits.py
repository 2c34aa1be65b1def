"""Endpoint limits: at most ``endpoint_concurrency`` model calls in flight and ``endpoint_rpm`` started per minute.

Every model call goes through :func:`dualmem.models.retry.invoke_with_retry` (or its
async twin), which holds one slot of the endpoint's :class:`Gate` for each
attempt: the slot is taken before the request is sent and given back when the
answer (or the error) is in, so waiting out a retry's backoff holds no slot.

- In one process the gate is a :class:`LocalGate` (a semaphore and a window of
  the last minute's starts), one per (endpoint, limits), built on first use.
- A cluster run installs a gate shared by every node (:func:`install`, see
  :mod:`dualmem.evals.cluster`): every process then asks the same gate.

Invariants: at no moment do more than ``concurrency`` slots of one gate
exist; in no 60-second window do more than ``rpm`` slots start (0: no per-minute
limit); a call made while its thread already holds a slot (a model call nested
in another) takes no second slot, so nesting never deadlocks. No background
thread: a waiting caller sleeps until the window lets it start.

>>> gate = LocalGate(concurrency=2, rpm=0)
>>> with slot(gate):
...     gate.in_flight
1
>>> gate.in_flight
0
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol

from dualmem.config import Settings

WINDOW_S = 60.0
_holding: contextvars.ContextVar[bool] = contextvars.ContextVar("dualmem_holding_slot", default=False)


class Gate(Protocol):
    """Where a model call waits for its slot: ``acquire`` blocks and returns a token that ``release`` gives back."""

    def acquire(self) -> Any:
        """Wait for a free slot (and the per-minute window); return its token."""
        ...

    def release(self, token: Any) -> None:
        """Give a slot back."""
        ...


class RateWindow:
    """The starts of the last minute: :meth:`wait_s` says how long until one more may start (pure, not thread-safe).

    >>> w = RateWindow(rpm=2)
    >>> w.take(0.0); w.take(1.0); w.wait_s(2.0)
    58.0
    >>> w.wait_s(60.0)
    0.0
    """

    def __init__(self, rpm: int, window_s: float = WINDOW_S) -> None:
        self.rpm, self.window_s = rpm, window_s
        self.starts: deque[float] = deque()

    def wait_s(self, now: float) -> float:
        """Return the seconds until a start at ``now`` keeps at most ``rpm`` starts in any window (0: at once)."""
        if self.rpm <= 0:
            return 0.0
        while self.starts and self.starts[0] <= now - self.window_s:
            self.starts.popleft()
        return 0.0 if len(self.starts) < self.rpm else self.starts[0] + self.window_s - now

    def take(self, now: float) -> None:
        """Record a start at ``now``."""
        if self.rpm > 0:
            self.starts.append(now)


class LocalGate:
    """The gate of one process: a condition over slots in flight and the per-minute window (thread-safe)."""

    def __init__(self, concurrency: int, rpm: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.concurrency, self.rpm, self.clock = concurrency, rpm, clock
        self.window = RateWindow(rpm)
        self.in_flight = 0
        self.peak = 0
        self.started = 0
        self._cond = threading.Condition()

    def acquire(self) -> None:
        """Wait until a slot is free and the window lets one more start; take it."""
        with self._cond:
            while True:
                wait = self.window.wait_s(self.clock())
                if self.concurrency and self.in_flight >= self.concurrency:
                    self._cond.wait()
                elif wait > 0:
                    self._cond.wait(wait)
                else:
                    break
            self.window.take(self.clock())
            self.in_flight += 1
            self.started += 1
            self.peak = max(self.peak, self.in_flight)

    def release(self, token: Any = None) -> None:
        """Give a slot back and wake one waiter."""
        with self._cond:
            self.in_flight -= 1
            self._cond.notify()


_gates: dict[tuple[str, int, int], Gate] = {}
_installed: dict[str, Gate] = {}
_lock = threading.Lock()


def endpoint_of(settings: Settings) -> str:
    """Return the endpoint a run's model calls go to: the OpenAI-compatible base URL, else ``"default"``."""
    from dualmem.redact import public_url

    return public_url(settings.openai_base_url).rstrip("/") or "default"  # a name: shown in Ray, never a password


def install(endpoint: str, gate: Gate | None) -> None:
    """Make ``gate`` the gate of every call to ``endpoint`` in this process (None: back to a local gate)."""
    with _lock:
        if gate is None:
            _installed.pop(endpoint, None)
        else:
            _installed[endpoint] = gate


def gate_for(settings: Settings) -> Gate | None:
    """Return the gate of ``settings``' endpoint: the installed one, else this process's local gate (None: no limits)."""
    endpoint = endpoint_of(settings)
    with _lock:
        if endpoint in _installed:
            return _installed[endpoint]
        if not settings.endpoint_concurrency and not settings.endpoint_rpm:
            return None
        key = (endpoint, settings.endpoint_concurrency, settings.endpoint_rpm)
        if key not in _gates:
            _gates[key] = LocalGate(settings.endpoint_concurrency, settings.endpoint_rpm)
        return _gates[key]


@contextmanager
def slot(gate: Gate | None) -> Iterator[None]:
    """Hold one slot of ``gate`` while inside (none when ``gate`` is None or this context already holds one)."""
    if gate is None or _holding.get():
        yield
        return
    token = gate.acquire()
    mark = _holding.set(True)
    try:
        yield
    finally:
        _holding.reset(mark)
        gate.release(token)


@asynccontextmanager
async def aslot(gate: Gate | None) -> AsyncIterator[None]:
    """Async :func:`slot` (the wait runs in the event loop's default executor, so the loop never blocks)."""
    if gate is None or _holding.get():
        yield
        return
    token = await asyncio.to_thread(gate.acquire)
    mark = _holding.set(True)
    try:
        yield
    finally:
        _holding.reset(mark)
        gate.release(token)


class SharedGate:
    """The endpoint's limits for every node of a run: a Ray actor of :mod:`dualmem.evals.cluster`, one process
    holding the counts. Async: waiters never hold a thread."""

    def __init__(self, concurrency: int, rpm: int, lease_s: float) -> None:
        self.concurrency, self.rpm, self.lease_s = concurrency, rpm, lease_s
        self.leases: dict[int, float] = {}  # lease id -> when it ends
        self.starts: deque[float] = deque()
        self.next_id, self.peak, self.started = 0, 0, 0
        self.cond = asyncio.Condition()

    def _wait_s(self, now: float) -> float:
        for lease, ends in list(self.leases.items()):
            if ends <= now:  # its holder died mid-call
                del self.leases[lease]
        while self.starts and self.starts[0] <= now - WINDOW_S:
            self.starts.popleft()
        if self.concurrency and len(self.leases) >= self.concurrency:
            return min(self.leases.values()) - now
        if self.rpm and len(self.starts) >= self.rpm:
            return self.starts[0] + WINDOW_S - now
        return 0.0

    async def acquire(self) -> int:
        """Wait for a slot and the per-minute window; return the lease id."""
        async with self.cond:
            while (wait := self._wait_s(time.monotonic())) > 0:
                try:
                    await asyncio.wait_for(self.cond.wait(), timeout=wait)
                except TimeoutError:
                    pass
            now = time.monotonic()
            self.next_id += 1
            self.leases[self.next_id] = now + self.lease_s
            self.starts.append(now)
            self.started += 1
            self.peak = max(self.peak, len(self.leases))
            return self.next_id

    async def release(self, lease: int) -> None:
        """Give a slot back."""
        async with self.cond:
            self.leases.pop(lease, None)
            self.cond.notify()

    async def stats(self) -> dict[str, int]:
        """Return calls started, the most in flight at once, and in flight now."""
        return {"started": self.started, "peak": self.peak, "in_flight": len(self.leases)}
