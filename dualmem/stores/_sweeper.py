"""The TTL sweeper of ``LanceDBStore``: a daemon thread deleting expired items every interval.

One store class serves LangGraph's sync and async APIs, so its sweeper handles
answer both: ``start_ttl_sweeper()`` returns a :class:`SweeperFuture` (a
``concurrent.futures.Future``, as ``PostgresStore`` returns) that can also be
awaited, which returns it at once (as ``await AsyncPostgresStore.start_ttl_sweeper()``
returns its task); ``stop_ttl_sweeper()`` returns :class:`Stopped`, true once the
sweeper stopped, which ``await`` turns into that bool.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Generator
from typing import Any


class SweeperFuture(concurrent.futures.Future[None]):
    """Done when the sweeper stops; ``await`` returns the future itself at once (it does not wait for the stop)."""

    def __await__(self) -> Generator[Any, None, SweeperFuture]:
        if False:  # a generator that finishes at once: nothing to wait for
            yield
        return self

    @classmethod
    def finished(cls) -> SweeperFuture:
        """Return a future that is already done (no TTL configured: nothing to sweep)."""
        future = cls()
        future.set_result(None)
        return future


class Stopped(int):
    """Truthy once the sweeper stopped (or none ran); ``await`` gives the plain bool."""

    def __await__(self) -> Generator[Any, None, bool]:
        if False:
            yield
        return bool(self)

    def __repr__(self) -> str:
        return repr(bool(self))


class Sweeper:
    """Run ``sweep`` in a background thread every interval until stopped."""

    def __init__(self, sweep: Callable[[], int]) -> None:
        self._sweep = sweep
        self._running: tuple[SweeperFuture, threading.Event] | None = None

    def start(self, minutes: float) -> SweeperFuture:
        """Start the thread (or return the running one's future)."""
        if self._running is not None and not self._running[0].done():
            return self._running[0]
        future, stop = SweeperFuture(), threading.Event()

        def loop() -> None:
            while not stop.wait(float(minutes) * 60.0):
                try:
                    self._sweep()
                except Exception:  # noqa: BLE001 - a failed sweep is retried at the next interval
                    continue
            future.set_result(None)

        threading.Thread(target=loop, name="lancedb-store-ttl-sweeper", daemon=True).start()
        self._running = (future, stop)
        return future

    def stop(self, timeout: float | None = None) -> Stopped:
        """Signal the thread and wait up to ``timeout`` seconds for it to finish its sweep."""
        if self._running is None:
            return Stopped(True)
        future, stop = self._running
        stop.set()
        try:
            future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            return Stopped(False)
        self._running = None
        return Stopped(True)
