"""The personality run's journal: every finished unit of a personality test, written once, read back on resume.

(An evaluation keeps its record on LanceDB storage every node reaches: :mod:`dualmem.evals.record`.)
A run folder's ``journal.sqlite`` holds one row per finished unit, keyed by
(kind, persona, key): ``ingest`` (one session's ingest log row), ``record``
(one query's retrieval, answer and metrics), ``judge`` (one judge's verdict on
one query), ``interview`` / ``assessment`` (personality tests). A resumed run
reads a unit instead of recomputing it, so no model call of a finished unit is
repeated; a unit cut by a crash is redone (its framework's own ledger skips the
chunks it had already applied). Writes commit at once (WAL), from any thread or process.

>>> import tempfile, pathlib
>>> j = Journal(pathlib.Path(tempfile.mkdtemp()) / "journal.sqlite")
>>> j.put("record", "p", "q1", {"answer": "hi"})
>>> j.get("record", "p", "q1")
{'answer': 'hi'}
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Protocol

JOURNAL = "journal.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS units (
    kind TEXT NOT NULL, persona TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    seq INTEGER NOT NULL, PRIMARY KEY (kind, persona, key)
)
"""


class StepLog(Protocol):
    """One persona's finished steps, as runners and judges read and write them (a :class:`PersonaJournal`, or a
    unit's steps in an evaluation's run record, :class:`dualmem.evals.record.UnitSteps`)."""

    def get(self, kind: str, key: str) -> Any:
        """Return a finished step, or None."""
        ...

    def put(self, kind: str, key: str, value: Any) -> None:
        """Record a finished step."""
        ...

    def put_all(self, kind: str, values: dict[str, Any]) -> None:
        """Record finished steps of ``kind`` by key (steps done together: one write where the log can)."""
        ...

    def judgement(self, query_id: str, judge: str) -> Any:
        """Return the recorded verdict of ``judge`` on ``query_id``, or None."""
        ...

    def put_judgement(self, query_id: str, judge: str, result: Any) -> None:
        """Record the verdict of ``judge`` on ``query_id``."""
        ...


class Journal:
    """Thread-safe key-value journal of finished units, one SQLite file per run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # several processes of one run (persona workers) write the same file: wait for each other's commits
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(_SCHEMA)

    def get(self, kind: str, persona: str, key: str) -> Any:
        """Return the value of a unit, or None when it has not finished."""
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM units WHERE kind=? AND persona=? AND key=?", (kind, persona, key)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, kind: str, persona: str, key: str, value: Any) -> None:
        """Record a finished unit (the first write wins: a unit is recorded once)."""
        text = json.dumps(value, ensure_ascii=False, default=str)
        with self._lock:  # one statement: its sequence number is taken under the write lock, also across processes
            self._conn.execute(
                "INSERT OR IGNORE INTO units SELECT ?, ?, ?, ?, COALESCE(MAX(seq), 0) + 1 FROM units",
                (kind, persona, key, text),
            )

    def items(self, kind: str, persona: str | None = None) -> list[tuple[str, str, Any]]:
        """Return (persona, key, value) of every unit of ``kind`` (of one persona if given), in write order."""
        sql, args = "SELECT persona, key, value FROM units WHERE kind=?", [kind]
        if persona is not None:
            sql, args = sql + " AND persona=?", [*args, persona]
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY seq", args).fetchall()
        return [(p, k, json.loads(v)) for p, k, v in rows]

    def count(self, kind: str) -> int:
        """Return how many units of ``kind`` are recorded."""
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM units WHERE kind=?", (kind,)).fetchone()[0])

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()

    def scope(self, persona: str) -> PersonaJournal:
        """Return a view of one persona's units."""
        return PersonaJournal(self, persona)


class PersonaJournal:
    """One persona's units: ingested sessions, answered queries, judge verdicts."""

    def __init__(self, journal: Journal, persona: str) -> None:
        self.journal, self.persona = journal, persona

    def get(self, kind: str, key: str) -> Any:
        """Return a finished unit of this persona, or None."""
        return self.journal.get(kind, self.persona, key)

    def put(self, kind: str, key: str, value: Any) -> None:
        """Record a finished unit of this persona."""
        self.journal.put(kind, self.persona, key, value)

    def put_all(self, kind: str, values: dict[str, Any]) -> None:
        """Record finished units of this persona by key."""
        for key, value in values.items():
            self.put(kind, key, value)

    def judgement(self, query_id: str, judge: str) -> Any:
        """Return the recorded verdict of ``judge`` on ``query_id``, or None."""
        return self.get("judge", f"{query_id}\x1f{judge}")

    def put_judgement(self, query_id: str, judge: str, result: Any) -> None:
        """Record the verdict of ``judge`` on ``query_id``."""
        self.put("judge", f"{query_id}\x1f{judge}", result)
