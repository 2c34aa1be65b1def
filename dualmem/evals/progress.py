"""Progress bars of long evaluations: rich bars on a terminal, timestamped plain lines in a log.

>>> from rich.console import Console
>>> with progress_bars(Console(stderr=True), enabled=False) as (bar, advance):
...     task = bar.add_task("queries", total=2)
...     advance(task)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Advance:
    """Advance a progress task; when stderr is not a terminal (a log file, CI), also print a line now and then.

    Rich draws nothing live into a file, so a long run written to a log would
    show no progress until it ends: there, a plain line is printed for a task's
    first and last step and at most every ``every_s`` seconds in between.
    """

    def __init__(self, bar: Progress, console: Console, *, logging: bool, every_s: float = 30.0) -> None:
        self.bar, self.console, self.logging, self.every_s = bar, console, logging, every_s
        self._last: dict[Any, float] = {}
        self._lock = threading.Lock()

    def __call__(self, task_id: Any) -> None:
        with self._lock:  # branches advance from several threads
            self.bar.advance(task_id)
            if not self.logging:
                return
            task = next(t for t in self.bar.tasks if t.id == task_id)
            now = time.monotonic()
            done = task.total is not None and task.completed >= task.total
            if task_id in self._last and not done and now - self._last[task_id] < self.every_s:
                return
            self._last[task_id] = now
            total = "?" if task.total is None else int(task.total)
            self.console.print(
                f"{time.strftime('%H:%M:%S')} {task.description}: {int(task.completed)}/{total}", highlight=False
            )


@contextmanager
def progress_bars(console: Console, *, enabled: bool = True) -> Iterator[tuple[Progress, Callable[[Any], None]]]:
    """Yield a rich ``Progress`` (disabled when not ``enabled``) and its thread-safe ``advance``."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
    ) as bar:
        yield bar, Advance(bar, console, logging=enabled and not console.is_terminal)
