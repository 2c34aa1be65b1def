"""Merge concurrent async store calls into one batch, as LangGraph's async stores do.

Each ``abatch`` call of a sync store would otherwise run in a thread of its
own and make its own commit; under a burst of concurrent ``aput``/``aget``
(a server, an agent fan-out) that is one LanceDB commit per call. Calls made on
one event loop while a batch is running wait and then go together: one plan,
one embedding request, one commit. Reads in a merged batch see the store as
it was before the batch's writes, and the last write of a key wins — the
semantics of LangGraph's ``AsyncBatchedBaseStore``. If a merged batch fails,
each call is run alone, so one caller's bad operation fails only that caller.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

Run = Callable[[list[Any]], Awaitable[list[Any]]]


class Coalescer:
    """Queue ``abatch`` calls per event loop and run them merged."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[tuple[list[Any], asyncio.Future[list[Any]]]]] = weakref.WeakKeyDictionary()
        self._tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()

    async def submit(self, ops: list[Any]) -> list[Any]:
        """Run ``ops`` merged with the calls queued on this loop; return this call's results."""
        if not ops:
            return []
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._pending.setdefault(loop, []).append((ops, future))
        task = self._tasks.get(loop)
        if task is None or task.done():
            self._tasks[loop] = loop.create_task(self._drain(loop))
        return await future

    async def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        await asyncio.sleep(0)  # let the calls issued in this tick join
        while self._pending.get(loop):
            calls, self._pending[loop] = self._pending[loop], []
            live = [(ops, fut) for ops, fut in calls if not fut.done()]  # a cancelled caller is dropped
            if not live:
                continue
            try:
                results = await self._run([op for ops, _ in live for op in ops])
            except Exception:  # noqa: BLE001 - isolate: run each call alone
                for ops, fut in live:
                    await self._alone(ops, fut)
                continue
            start = 0
            for ops, fut in live:
                if not fut.done():
                    fut.set_result(results[start : start + len(ops)])
                start += len(ops)

    async def _alone(self, ops: list[Any], fut: asyncio.Future[list[Any]]) -> None:
        try:
            result = await self._run(ops)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(result)
