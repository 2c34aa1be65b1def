"""Background memory formation in this process: a small debounced executor (as LangMem's ReflectionExecutor).

Per chat thread it holds at most one plan: *now* (the pending turns reached a
chunk) and/or a *quiet time* (``formation_idle_s`` after the latest message;
each new message postpones it). Due plans run the write graph's pending mode
(:func:`~dualmem.chat.formation.run_formation`) on a few daemon worker threads,
one run per thread at a time, off the reply's path. After a run that left a
short tail pending, the thread's quiet time is planned again from its newest
turn. Nothing is kept only here: the turns wait in the store, so a process that
dies (or exits before the quiet time) loses nothing — :meth:`recover` in the
next process, ``dualmem chat`` or ``dualmem flush`` write them.

>>> executor = FormationExecutor(workers=1)
>>> executor.flush()
[]
>>> executor.shutdown()
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dualmem.chat.formation import Formed, run_formation
from dualmem.chat.pending import FormationRequest, PendingThread, pending_threads

log = logging.getLogger("dualmem.chat")
Key = tuple[str, tuple[str, ...], str]


@dataclass
class _Plan:
    request: FormationRequest
    now: bool = False
    quiet_at: float | None = None  # monotonic deadline of the quiet-time write
    flush: bool = False


class FormationExecutor:
    """Form chat memory in background threads of this process, one debounced write per chat thread."""

    def __init__(self, workers: int = 2, on_formed: Callable[[Formed], None] | None = None, keep: int = 1000) -> None:
        self.on_formed = on_formed
        self.formed: deque[Formed] = deque(maxlen=keep)  # the latest runs' results, newest last
        self._plans: dict[Key, _Plan] = {}
        self._running: set[Key] = set()
        self._ready: deque[tuple[Key, _Plan]] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._flushes: list[list[Formed]] = []  # one collector per flush() in progress
        self._threads = [threading.Thread(target=self._plan_loop, name="dualmem-formation-plans", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work_loop, name=f"dualmem-formation-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ Formation

    def schedule(self, request: FormationRequest, *, now: bool) -> None:
        """Plan the thread's write: at once (``now``) and at its quiet time (postponed by every call)."""
        with self._cv:
            plan = self._plans.setdefault(request.key, _Plan(request))
            plan.request = request
            plan.now = plan.now or now
            plan.quiet_at = time.monotonic() + request.settings.tuning.formation_idle_s
            self._cv.notify_all()

    async def aschedule(self, request: FormationRequest, *, now: bool) -> None:
        """Async :meth:`schedule` (it never blocks)."""
        self.schedule(request, now=now)

    # ------------------------------------------------------------------ control

    def flush(self, timeout: float | None = None, progress: bool | None = None) -> list[Formed]:
        """Write every planned thread's pending turns now, the unfinished last chunk too; return the runs' results.

        ``progress`` (default: when stderr is a terminal) prints a line to stderr as the flush starts and as each
        thread's run ends: with a local model a chunk takes seconds to minutes.
        """
        show = sys.stderr.isatty() if progress is None else progress
        collected: list[Formed] = []
        with self._cv:
            self._flushes.append(collected)
            for plan in self._plans.values():
                plan.now = plan.flush = True
            threads = len(self._plans) + len(self._running) + len(self._ready)
            self._cv.notify_all()
        if show and threads:
            print(
                f"dualmem: writing the pending chat turns of {threads} thread(s) into memory…",
                file=sys.stderr,
                flush=True,
            )
        said = 0

        def report() -> None:
            nonlocal said
            for formed in collected[said:]:
                print(_line(formed), file=sys.stderr, flush=True)
            said = len(collected)

        try:
            self.wait(timeout, on_change=report if show else None)
        finally:
            with self._cv:
                self._flushes.remove(collected)
        return collected

    def wait(self, timeout: float | None = None, on_change: Callable[[], None] | None = None) -> bool:
        """Block until no write is planned or running (quiet times included); False when ``timeout`` ran out first.
        ``on_change`` is called (holding no lock) each time the executor's state may have changed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cv:
                if not (self._plans or self._running or self._ready):
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left if left is not None else 1.0)
            if on_change is not None:
                on_change()
        if on_change is not None:
            on_change()
        return True

    def recover(self, store: Any, settings: Any, *, namespace: tuple[str, ...] = (), writer_model: Any = None) -> int:
        """Plan a write of every thread left with pending turns in ``store`` (under ``namespace``); return how many."""
        count = 0
        for ns, thread in pending_threads(store, namespace):
            snap = PendingThread(store, ns, thread).read()
            if not snap.turns or not snap.persona:
                continue
            request = FormationRequest(snap.persona, ns, thread, settings, store=store, writer_model=writer_model)
            with self._cv:
                plan = self._plans.setdefault(request.key, _Plan(request))
                plan.now = True  # full chunks at once; the tail when quiet (the run plans it from its newest turn)
                self._cv.notify_all()
            count += 1
        return count

    def shutdown(self, wait: bool = False, timeout: float | None = None) -> None:
        """Stop planning; with ``wait``, first let planned and running writes finish (quiet times included)."""
        if wait:
            self.wait(timeout)
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def __enter__(self) -> FormationExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=False)

    # ------------------------------------------------------------------ threads

    def _plan_loop(self) -> None:
        with self._cv:
            while not self._stopping:
                now = time.monotonic()
                due = [
                    k
                    for k, p in self._plans.items()
                    if k not in self._running and (p.now or (p.quiet_at is not None and p.quiet_at <= now))
                ]
                for key in due:
                    plan = self._plans.pop(key)
                    self._running.add(key)
                    self._ready.append((key, plan))
                    # what is still wanted after this run: the quiet time, unless this run is it (or a flush)
                    if not plan.flush and plan.quiet_at is not None and plan.quiet_at > now:
                        self._plans[key] = _Plan(plan.request, quiet_at=plan.quiet_at)
                    self._cv.notify_all()
                waits = [
                    p.quiet_at - now
                    for k, p in self._plans.items()
                    if p.quiet_at is not None and k not in self._running
                ]
                self._cv.wait(max(0.0, min(waits)) if waits else None)

    def _work_loop(self) -> None:
        while True:
            with self._cv:
                while not self._ready and not self._stopping:
                    self._cv.wait()
                if self._stopping and not self._ready:
                    return
                key, plan = self._ready.popleft()
            formed = self._run(plan)
            with self._cv:
                self._running.discard(key)
                self.formed.append(formed)
                for collected in self._flushes:
                    collected.append(formed)
                if formed.pending_turns and formed.error is None and key not in self._plans and not plan.flush:
                    if self._flushes:  # a flush is waiting: write the tail now
                        self._plans[key] = _Plan(plan.request, now=True, flush=True)
                    else:  # write the tail once the thread is quiet
                        idle = plan.request.settings.tuning.formation_idle_s
                        later = (formed.newest_at or time.time()) + idle - time.time()
                        self._plans[key] = _Plan(plan.request, quiet_at=time.monotonic() + max(0.0, later))
                elif key in self._plans and self._flushes:
                    self._plans[key].now = self._plans[key].flush = True
                self._cv.notify_all()
            if self.on_formed is not None:
                self.on_formed(formed)

    def _run(self, plan: _Plan) -> Formed:
        request = plan.request
        try:
            return run_formation(request, flush=plan.flush)
        except Exception as exc:  # noqa: BLE001 - the turns stay pending; the next message or recover() retries
            log.warning(
                "memory formation of thread %s %s failed (its turns stay pending): %s",
                request.thread,
                request.namespace,
                exc,
            )
            return Formed(request.namespace, request.thread, error=f"{type(exc).__name__}: {exc}")


def _line(formed: Formed) -> str:
    """Return the progress line of one formation run."""
    chunks = sum(1 for row in formed.rows if row.get("status") == "applied")
    outcome = f"failed ({formed.error}); its turns stay pending" if formed.error else f"{chunks} chunk(s) written"
    return f"dualmem: thread {formed.thread} of {'/'.join(formed.namespace)}: {outcome}"


_default: FormationExecutor | None = None
_default_lock = threading.Lock()


def default_executor() -> FormationExecutor:
    """Return this process's shared formation executor (started on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = FormationExecutor()
        return _default
