"""The LanceDB backend's ledger: which units of work (writer chunks, ingested sessions) a namespace has applied.

A row per (namespace, unit id), keyed by ``id`` (LanceDB's unenforced primary key:
concurrent marks of one unit leave one row), in state ``pending`` (the plan is
drafted and stored in ``payload``, not yet applied) or ``applied``. Writers
change a namespace's rows only while they hold its write lease
(:mod:`dualmem.stores.leases`), and apply every pending plan before drafting a
new one, so a plan drafted by a writer that died is applied by the next one,
word for word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.schema import stable_id, utcnow
from dualmem.stores._rows import one_per_key
from dualmem.stores._sql import and_all, ns_eq_sql, ns_key

TABLE = "chunk_ledger"
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("chunk_id", pa.string()),
        pa.field("payload", pa.string()),
        pa.field("applied_at", pa.timestamp("us", tz="UTC")),
        pa.field("state", pa.string()),
    ]
)


def ledger_id(namespace: Sequence[str], unit: str) -> str:
    """Return the ledger row id of a unit of work (namespace-scoped)."""
    return stable_id(ns_key(namespace), unit, prefix="chunk-")


class LanceLedger:
    """Pending and applied units of work per namespace, in one LanceDB table."""

    def __init__(self, db: Any) -> None:
        self.table = L.open_or_create(db, TABLE, SCHEMA)
        L.migrate_columns(self.table, SCHEMA, {"state": "'applied'"})
        self._schema = L.ensure_primary_key(self.table, "id")
        L.ensure_indexes(self.table, L.base_index_configs({"id": "BTREE", "namespace": "BITMAP"}))

    def _rows(self, where: str | None) -> list[dict[str, Any]]:
        rows = one_per_key(
            L.scan(self.table, where, ["id", "chunk_id", "state", "payload", "applied_at"]), "id", "applied_at"
        )
        return sorted(rows.to_pylist(), key=lambda r: (r["applied_at"], r["id"]))

    def look(self, namespace: Sequence[str], unit: str) -> tuple[tuple[str, str] | None, list[tuple[str, str]]]:
        """Return (the state and payload of ``unit`` or None, the namespace's pending units oldest first) in one read."""
        mine = ledger_id(namespace, unit)
        rows = self._rows(and_all(ns_eq_sql(namespace), f"state = 'pending' OR id = '{mine}'"))
        found = next(((r["state"] or "applied", r["payload"] or "") for r in rows if r["id"] == mine), None)
        return found, [(r["chunk_id"], r["payload"]) for r in rows if r["state"] == "pending"]

    def applied(self, namespace: Sequence[str], unit: str) -> bool:
        """Return True if the unit was applied."""
        rows = self._rows(f"id = '{ledger_id(namespace, unit)}'")
        return bool(rows) and (rows[0]["state"] or "applied") == "applied"

    def applied_ids(self, namespace: Sequence[str]) -> set[str]:
        """Return the ids of every applied unit of a namespace."""
        return {r["chunk_id"] for r in self._rows(and_all(ns_eq_sql(namespace), "state = 'applied' OR state IS NULL"))}

    def units(self, namespace: Sequence[str]) -> tuple[set[str], list[tuple[str, str]]]:
        """Return (the ids of every applied unit, the pending units oldest first with their payloads) in one read."""
        rows = self._rows(ns_eq_sql(namespace))
        pending = [(r["chunk_id"], r["payload"]) for r in rows if r["state"] == "pending"]
        return {r["chunk_id"] for r in rows if (r["state"] or "applied") == "applied"}, pending

    def mark(self, namespace: Sequence[str], unit: str, state: str, payload: str = "") -> None:
        """Record a unit's state (call it while holding the namespace's write lease)."""
        self.mark_all(namespace, [(unit, state, payload)])

    def mark_all(self, namespace: Sequence[str], marks: Sequence[tuple[str, str, str]]) -> None:
        """Record several ``(unit, state, payload)`` in one commit (call it while holding the write lease)."""
        if not marks:
            return
        now, key = utcnow(), ns_key(namespace)
        rows = [
            {
                "id": ledger_id(namespace, unit),
                "namespace": key,
                "chunk_id": unit,
                "payload": payload,
                "applied_at": now,
                "state": state,
            }
            for unit, state, payload in marks
        ]
        data = pa.Table.from_pylist(rows, schema=self._schema)
        L.retry(
            lambda: self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
        )

    def drop(self, namespace: Sequence[str]) -> int:
        """Forget every unit of a namespace; return how many rows went."""
        return int(L.retry(lambda: self.table.delete(ns_eq_sql(namespace))).num_deleted_rows)
