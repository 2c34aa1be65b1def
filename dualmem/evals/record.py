"""The run record: what an evaluation finished, on LanceDB storage every node of a cluster reaches.

A run's record lives at ``<run store>/_runs/<fingerprint>`` (a local folder,
a shared one, or object storage such as ``s3://bucket/…``; a persona's store
folder never starts with ``_``, so it never meets a record), in tables:

- ``run``: the run's spec (what ``run.json`` holds), so ``dualmem eval
  --resume URI`` needs nothing but the record;
- ``units``: a row per finished persona × framework unit, keyed by ``uid``,
  holding the unit's result (records, ingest log); a unit found here is not
  scheduled again. Rows are appended (appends of many writers never conflict,
  and cost no scan of the rows before them); a unit finished twice (a replay)
  may leave two rows of one ``uid``, and readers take its first;
- ``steps-<id>``: one table per unit: its ingested sessions, scored queries
  and judge verdicts, keyed by ``key`` (kind and key); a unit run again (its
  worker lost, its driver killed) reads them back instead of recomputing.
  Every write is an insert-if-absent ``merge_insert`` on the declared
  (unenforced) primary key: the first write of a step wins, and a replay or a
  concurrent duplicate (a lost worker's retry racing a survivor) changes
  nothing, so a query is scored once, whichever process or machine wrote it.
  Beside each step, in the same write, a ``cost`` row holds the counts of the
  model calls the unit made since its previous one (:mod:`dualmem.evals.cost`),
  keyed by the attempt and a sequence number: the unit's cost is the sum of
  its cost rows, each call counted once however often the unit was resumed.

A unit's steps are read once when it starts (one unit runs in one place at a
time, and only it writes its table) and kept beside what it writes since, so
its reads cost no storage round trip.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.schema import stable_id, utcnow
from dualmem.stores._sql import sql_str

RECORD_DIR = "_runs"
PK = {"lance-schema:unenforced-primary-key": "true"}  # declared at creation: no second commit to declare it
UNITS = pa.schema(
    [
        pa.field("uid", pa.string(), nullable=False, metadata=PK),
        pa.field("framework", pa.string()),
        pa.field("persona", pa.string()),
        pa.field("result", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)
STEPS = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False, metadata=PK),
        pa.field("kind", pa.string()),
        pa.field("value", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)
RUN = pa.schema([pa.field("name", pa.string(), nullable=False, metadata=PK), pa.field("value", pa.string())])


def record_uri(store: str, fingerprint: str) -> str:
    """Return where the record of the run ``fingerprint`` lives under its store ``store``."""
    return f"{store.rstrip('/')}/{RECORD_DIR}/{fingerprint}"


def unit_id(framework: str, persona: str) -> str:
    """Return the key of one persona × framework unit."""
    return f"{framework}\x1f{persona}"


def _insert_new(table: Any, key: str, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` whose ``key`` is not in ``table`` yet (first write wins; safe from any number of writers)."""
    data = pa.Table.from_pylist(rows, schema=table.schema)
    L.retry(lambda: table.merge_insert(key).when_not_matched_insert_all().execute(data))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class RunRecord:
    """The record of one run at ``uri`` (see the module docstring); ``options`` are LanceDB storage options."""

    def __init__(self, uri: str, options: str | Mapping[str, str] | None = None) -> None:
        self.uri, self.options = uri, L.storage_options(options) or {}
        self.db = L.connect(uri, self.options)
        self.units = L.open_or_create(self.db, "units", UNITS)
        L.ensure_primary_key(self.units, "uid")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses to Ray workers as its address, reopened there
        return (RunRecord, (self.uri, self.options))

    def write_spec(self, run: Mapping[str, Any]) -> None:
        """Keep the run's ``run.json`` content (its spec) in the record, once."""
        table = L.open_or_create(self.db, "run", RUN)
        _insert_new(table, "name", [{"name": "run", "value": _dumps(dict(run))}])

    def read_spec(self) -> dict[str, Any] | None:
        """Return the run's ``run.json`` content kept in the record, or None."""
        try:
            table = self.db.open_table("run")
        except (FileNotFoundError, ValueError):
            return None
        rows = L.query_rows(table, "name = 'run'", ["value"], limit=1)
        return json.loads(rows[0]["value"]) if rows else None

    def finished(self, framework: str) -> dict[str, dict[str, Any]]:
        """Return ``{persona: result}`` of every finished unit of ``framework`` (its first row when a replay left two)."""
        rows = L.query_rows(self.units, f"framework = {sql_str(framework)}", ["persona", "result", "at"])
        out: dict[str, dict[str, Any]] = {}
        for row in sorted(rows, key=lambda r: r["at"]):
            out.setdefault(row["persona"], json.loads(row["result"]))
        return out

    def finish(self, framework: str, persona: str, result: Mapping[str, Any]) -> None:
        """Record a finished unit and its result (appended: see the module docstring)."""
        row = {
            "uid": unit_id(framework, persona),
            "framework": framework,
            "persona": persona,
            "result": _dumps(dict(result)),
            "at": utcnow(),
        }
        data = pa.Table.from_pylist([row], schema=self.units.schema)
        L.retry(lambda: self.units.add(data))

    def steps(self, framework: str, persona: str) -> UnitSteps:
        """Return the steps of one unit (read from storage now)."""
        return UnitSteps(self.db, f"steps-{stable_id(framework, persona)}")


class UnitSteps:
    """One unit's finished steps: ``get``/``put`` by (kind, key), as the runners and judges journal them; with a
    ``meter`` (:class:`dualmem.evals.cost.Meter`), the counts of its calls since the last step written with each."""

    def __init__(self, db: Any, name: str) -> None:
        self.db, self.name = db, name
        self.meter: Any = None
        self._attempt, self._spent = uuid.uuid4().hex[:12], 0
        try:
            self.table: Any = db.open_table(name)
        except (FileNotFoundError, ValueError):  # not created yet: the unit's first step creates it
            self.table = None
        self._done: dict[str, Any] = {}
        self._lock = threading.Lock()
        if self.table is not None:
            for row in L.query_rows(self.table, None, ["key", "value"]):
                self._done.setdefault(row["key"], json.loads(row["value"]))

    def get(self, kind: str, key: str) -> Any:
        """Return a finished step, or None."""
        return self._done.get(f"{kind}\x1f{key}")

    def put(self, kind: str, key: str, value: Any) -> None:
        """Record a finished step (the first write of a step wins), with the cost of the calls made since the last."""
        self.put_all(kind, {key: value})

    def put_all(self, kind: str, values: dict[str, Any]) -> None:
        """Record finished steps of ``kind`` by key in one write (see :meth:`put`)."""
        with self._lock:
            new = [(full, kind, v) for k, v in values.items() if (full := f"{kind}\x1f{k}") not in self._done]
            if new:
                self._write([*new, *self._cost()])

    def spend(self) -> None:
        """Record the cost of the calls made since the last step (when a unit ends)."""
        with self._lock:
            if rows := self._cost():
                self._write(rows)

    def spent(self) -> list[dict[str, Any]]:
        """Return the cost rows of every attempt of this unit (see :mod:`dualmem.evals.cost`)."""
        return [v for k, v in self._done.items() if k.startswith("cost\x1f")]

    def _cost(self) -> list[tuple[str, str, Any]]:
        new = self.meter.take() if self.meter is not None else {}
        if not new:
            return []
        self._spent += 1
        return [(f"cost\x1f{self._attempt}\x1f{self._spent}", "cost", new)]

    def _write(self, steps: list[tuple[str, str, Any]]) -> None:
        if self.table is None:
            self.table = L.open_or_create(self.db, self.name, STEPS)
        now = utcnow()
        _insert_new(
            self.table,
            "key",
            [{"key": full, "kind": kind, "value": _dumps(value), "at": now} for full, kind, value in steps],
        )
        for full, _kind, value in steps:
            self._done[full] = json.loads(_dumps(value))

    def count(self, kind: str) -> int:
        """Return how many steps of ``kind`` this unit finished."""
        return sum(1 for k in self._done if k.startswith(f"{kind}\x1f"))

    def judgement(self, query_id: str, judge: str) -> Any:
        """Return the recorded verdict of ``judge`` on ``query_id``, or None."""
        return self.get("judge", f"{query_id}\x1f{judge}")

    def put_judgement(self, query_id: str, judge: str, result: Any) -> None:
        """Record the verdict of ``judge`` on ``query_id``."""
        self.put("judge", f"{query_id}\x1f{judge}", result)
