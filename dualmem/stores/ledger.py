"""The chunk ledger: which units of work (writer chunks, ingested sessions) a namespace has applied.

A row per (namespace, unit id) in state ``pending`` (the plan is drafted and
stored in ``payload``, not yet applied) or ``applied``. Writers change a
namespace's rows only while they hold its write lease (:mod:`dualmem.stores.leases`),
and apply every pending plan before drafting a new one, so a plan drafted by
a writer that died is applied by the next one, word for word — nothing is
asked twice, lost or applied twice, in any process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.schema import stable_id, utcnow
from dualmem.stores._sql import and_all, ns_eq_sql, ns_key, sql_str

TABLE = "chunk_ledger"
State = Literal["pending", "applied"]
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("namespace", pa.string()),
        pa.field("chunk_id", pa.string()),
        pa.field("payload", pa.string()),
        pa.field("applied_at", pa.timestamp("us", tz="UTC")),
        pa.field("state", pa.string()),
    ]
)


def ledger_id(namespace: Sequence[str], chunk_id: str) -> str:
    """Return the ledger row id of a unit of work (namespace-scoped)."""
    return stable_id(ns_key(namespace), chunk_id, prefix="chunk-")


class Ledger:
    """Pending and applied units of work per namespace, in one LanceDB table."""

    def __init__(self, db: Any) -> None:
        self.table = L.open_or_create(db, TABLE, SCHEMA)
        L.migrate_columns(self.table, SCHEMA, {"state": "'applied'"})
        L.ensure_indexes(self.table, L.base_index_configs({"id": "BTREE", "namespace": "BITMAP"}))
        self._maintain = L.AutoOptimize()
        self._schema = self.table.schema  # read once: each read is a round trip to LanceDB's event loop

    def get(self, namespace: Sequence[str], chunk_id: str) -> tuple[State, str] | None:
        """Return (state, payload) of a unit, or None if the namespace never saw it."""
        rows = L.query_rows(self.table, f"id = {sql_str(ledger_id(namespace, chunk_id))}", ["state", "payload"], 1)
        return (rows[0]["state"] or "applied", rows[0]["payload"] or "") if rows else None

    def applied(self, namespace: Sequence[str], chunk_id: str) -> bool:
        """Return True if the unit was applied."""
        found = self.get(namespace, chunk_id)
        return found is not None and found[0] == "applied"

    def applied_ids(self, namespace: Sequence[str]) -> set[str]:
        """Return the ids of every applied unit of a namespace."""
        where = and_all(ns_eq_sql(namespace), "state = 'applied' OR state IS NULL")
        return {r["chunk_id"] for r in L.query_rows(self.table, where, ["chunk_id"])}

    def look(self, namespace: Sequence[str], chunk_id: str) -> tuple[tuple[State, str] | None, list[tuple[str, str]]]:
        """Return (the state of ``chunk_id`` or None, the namespace's pending units) in one read."""
        where = and_all(ns_eq_sql(namespace), f"state = 'pending' OR id = {sql_str(ledger_id(namespace, chunk_id))}")
        rows = sorted(L.query_rows(self.table, where, ["chunk_id", "state", "payload", "applied_at"]), key=lambda r: r["applied_at"])
        mine = next(((r["state"] or "applied", r["payload"] or "") for r in rows if r["chunk_id"] == chunk_id), None)
        return mine, [(r["chunk_id"], r["payload"]) for r in rows if r["state"] == "pending"]  # type: ignore[return-value]

    def pending(self, namespace: Sequence[str]) -> list[tuple[str, str]]:
        """Return (unit id, payload) of the namespace's drafted-but-unapplied units, oldest first."""
        where = and_all(ns_eq_sql(namespace), "state = 'pending'")
        rows = L.query_rows(self.table, where, ["chunk_id", "payload", "applied_at"])
        rows.sort(key=lambda r: r["applied_at"])
        return [(r["chunk_id"], r["payload"]) for r in rows]

    def mark(self, namespace: Sequence[str], chunk_id: str, state: State, payload: str = "", *, new: bool = False) -> None:
        """Record a unit's state (call it while holding the namespace's write lease).

        ``new``: the caller saw (under that lease) that the unit has no row yet, so it is
        appended, about half the work of an upsert; without it the row is upserted.
        """
        row = {
            "id": ledger_id(namespace, chunk_id),
            "namespace": ns_key(namespace),
            "chunk_id": chunk_id,
            "payload": payload,
            "applied_at": utcnow(),
            "state": state,
        }
        data = pa.Table.from_pylist([row], schema=self._schema)
        if new:
            L.retry(lambda: self.table.add(data))
        else:
            L.retry(lambda: self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data))
        self._maintain.committed(self.table)

    def drop(self, namespace: Sequence[str]) -> None:
        """Forget every unit of a namespace."""
        L.retry(lambda: self.table.delete(ns_eq_sql(namespace)))
