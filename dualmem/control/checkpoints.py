"""A user's threads in the SQLite checkpointer (``checkpoint_path``): found, deleted, and the file rewritten.

How a user's threads are known, in this order:

1. the chat threads recorded with their namespace in the LangGraph store
   (``("dualmem_pending", persona, user, thread)``: every chat that handed turns
   to memory formation; the record outlives the turns);
2. checkpoints whose metadata names the namespace: runs started with
   ``config={"metadata": thread_metadata(persona, user), ...}`` (LangGraph writes a
   run's metadata into each checkpoint it saves);
3. thread ids the caller names (``forget(..., threads=[...])``, ``dualmem forget --thread``).

Deleting uses the saver's ``delete_thread``; SQLite then still holds the deleted
rows in free pages and in its write-ahead log, so the file is rewritten
(``VACUUM``) and the log truncated (``wal_checkpoint(TRUNCATE)``) — a reader
holding the file open at that moment may make the truncation wait for it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dualmem.errors import ConfigurationError

PERSONA_KEY, USER_KEY = "dualmem_persona", "dualmem_user"


def thread_metadata(persona: str, user: str) -> dict[str, str]:
    """Return the run metadata that ties a checkpointed thread to a memory namespace (so forget finds it).

    >>> thread_metadata("mara", "theo")
    {'dualmem_persona': 'mara', 'dualmem_user': 'theo'}
    """
    return {PERSONA_KEY: str(persona), USER_KEY: str(user)}


@contextmanager
def _saver(path: str) -> Iterator[Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def checkpoint_file(path: str | None, store_uri: str, *, explicit: bool) -> tuple[str | None, str]:
    """Return (the checkpoint file forget reads, a note when a configured file does not exist).

    A relative path is read from the working folder, as every command writes it; when it is not there and it is the
    default path, the file beside a local store's folder (``.dualmem/checkpoints.sqlite`` next to
    ``.dualmem/lancedb``) is taken, so a forget run from another folder with ``--store`` finds the user's checkpoints.
    """
    if not path or path == ":memory:":
        return None, ""
    file = Path(path).expanduser()
    if file.is_file():
        return str(file.resolve()), ""
    if not file.is_absolute() and not explicit and "://" not in store_uri:
        beside = Path(store_uri).expanduser().resolve().parent / file.name
        if beside.is_file():
            return str(beside), ""
    if explicit:
        return str(file), f"no checkpoint file at {file.resolve()} (checkpoint_path): no checkpoints to delete there"
    return str(file), ""


def check_checkpoints(path: str | None, note: str, threads: Sequence[str]) -> None:
    """Refuse (one line, before anything is deleted) to forget a user with chat threads when the default checkpoint
    file is found neither in the working folder nor beside the store: their checkpoints would silently stay."""
    if not threads or not path or note or path == ":memory:" or Path(path).expanduser().is_file():
        return
    raise ConfigurationError(
        f"this user has {len(threads)} chat thread(s) but no checkpoint file was found at {Path(path).resolve()} "
        "(checkpoint_path, relative to the folder you run in) nor beside the store: run from the folder that holds "
        "it, or pass --checkpoints FILE (DUALMEM_CHECKPOINT_PATH); nothing was forgotten"
    )


def _file(path: str | None) -> str | None:
    if not path or path == ":memory:":
        return None
    file = Path(path).expanduser()
    return str(file) if file.is_file() else None


def checkpointed_threads(path: str | None, persona: str, user: str | None, candidates: Sequence[str] = ()) -> list[str]:
    """Return the threads of the checkpointer at ``path`` that belong to the namespace: those among ``candidates``
    that have checkpoints, and those whose checkpoint metadata names it (``user`` None: any user of the persona)."""
    file = _file(path)
    if file is None:
        return []
    wanted = {PERSONA_KEY: persona, **({USER_KEY: user} if user is not None else {})}
    with _saver(file) as saver:
        found = {t.config["configurable"]["thread_id"] for t in saver.list(None, filter=wanted)}
        for thread in candidates:
            if next(iter(saver.list({"configurable": {"thread_id": thread}}, limit=1)), None) is not None:
                found.add(thread)
    return sorted(found)


def delete_threads(path: str | None, threads: Sequence[str]) -> int:
    """Delete every checkpoint and pending write of ``threads``, then rewrite the file; return how many threads."""
    file = _file(path)
    if file is None or not threads:
        return 0
    with _saver(file) as saver:
        for thread in threads:
            saver.delete_thread(thread)
        saver.conn.commit()
        saver.conn.execute("VACUUM")
        saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return len(threads)
