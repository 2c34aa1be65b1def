"""Run a graph resumably under a SQLite checkpointer.

A thread that stopped half-way (killed, interrupted) is finished first; then
the given input batches run one after the other on the same thread, each
checkpoint staying small. ``check(snapshot)`` may look at a thread before
anything runs and return its saved values to skip the run (a thread that
finished before) or raise (a thread started with other options).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Update = Callable[[dict[str, Any]], None]
Check = Callable[[Any], dict[str, Any] | None]


def _plan(interrupted: bool, batches: Iterable[Any]) -> Iterator[Any]:
    """Yield the inputs to stream: None (resume) for an interrupted thread, then each batch."""
    if interrupted:
        yield None
    yield from batches


def _sqlite_file(path: str | None, given: Any) -> Path | None:
    """Return the SQLite file to open (its folder created), or None when ``given`` or a missing path decides the saver."""
    if given is not None or not path:
        return None
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    return file


@contextmanager
def sqlite_saver(path: str | None, given: Any = None) -> Iterator[Any]:
    """Yield ``given`` (a saver, or False for none) or a SQLite saver at ``path`` (None: none)."""
    if (file := _sqlite_file(path, given)) is None:
        yield given or None
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(file), check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def run_resumable(
    builder: Any,
    batches: Iterable[Any],
    config: Any,
    *,
    context: Any = None,
    store: Any = None,
    path: str | None = None,
    checkpointer: Any = None,
    on_update: Update | None = None,
    check: Check | None = None,
) -> dict[str, Any]:
    """Run ``batches`` on ``config``'s thread (finishing an interrupted run first); return the final values."""
    with sqlite_saver(path, checkpointer) as saver:
        graph = builder.compile(checkpointer=saver, store=store)
        snapshot = graph.get_state(config) if saver is not None else None
        if snapshot is not None and check is not None and (done := check(snapshot)) is not None:
            return done
        values: dict[str, Any] = {}
        for start in _plan(bool(snapshot and snapshot.next), batches):
            for mode, chunk in graph.stream(start, config, context=context, stream_mode=["updates", "values"]):
                if mode == "values":
                    values = chunk
                elif on_update is not None:
                    on_update(chunk)
        return dict(graph.get_state(config).values) if saver is not None else dict(values)
