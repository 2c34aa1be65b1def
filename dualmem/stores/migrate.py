"""The storage format, and moving a store written by an earlier layout to the current one (``dualmem migrate``).

Formats:

- **1** — facts and insights in two tables (``facts``, ``insights``) and a chunk ledger whose ``id`` column may be
  null (DualMem before the one store contract);
- **2** — one ``memory`` table (its schema metadata records ``dualmem.format: 2``) and a ledger keyed by ``id``.

A format-1 store is never opened silently: :func:`check_format` refuses it with one line naming ``dualmem migrate``.
:func:`migrate` moves it: a dry run lists what it would do; a local folder is first copied whole beside itself
(``<folder>.backup-<time>``); on object storage the old tables stay until the new ones hold every row (the old
ledger is kept as ``chunk_ledger_format1`` until the new one is verified), so a migration stopped part-way is run
again from where it stopped and loses nothing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from dualmem.errors import ConfigurationError
from dualmem.stores import _lance as L
from dualmem.stores._rows import item_schema
from dualmem.stores._sql import ns_parse

FORMAT = 2
FORMAT_KEY = "dualmem.format"
LEGACY_TABLES = ("facts", "insights")
MEMORY, LEDGER = "memory", "chunk_ledger"
LEDGER_BACKUP = "chunk_ledger_format1"


def store_format(db: Any, names: list[str] | None = None) -> int | None:
    """Return the format of the store ``db`` (None: no memory written yet); ``names``: its tables, if listed."""
    names = L.table_names(db) if names is None else names
    if any(n in names for n in (*LEGACY_TABLES, LEDGER_BACKUP)):
        return 1
    if LEDGER in names and db.open_table(LEDGER).schema.field("id").nullable:
        return 1
    return FORMAT if MEMORY in names else None


def check_format(db: Any, uri: str, names: list[str] | None = None) -> None:
    """Refuse (one line naming the fix) a store written in an earlier format; ``names``: its tables, if listed."""
    if store_format(db, names) == 1:
        raise ConfigurationError(
            f"the store at {uri} was written by an earlier DualMem (format 1: separate facts and insights tables); "
            f"migrate it first: dualmem migrate --store {uri} (add --dry-run to see what it does; local folders are "
            "backed up)"
        )


@dataclass
class Migration:
    """What a migration found and did (``lines`` reads it)."""

    uri: str
    found: int | None
    counts: dict[str, int] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    backup: str | None = None

    def lines(self) -> list[str]:
        """Return the report, one line a step."""
        if self.found != 1:
            return [f"{self.uri}: format {self.found or 'empty'}, nothing to migrate"]
        head = [f"{self.uri}: format 1 -> {FORMAT}: " + ", ".join(f"{v} {k}" for k, v in self.counts.items())]
        return head + [f"  {line}" for line in self.done]


def migrate(uri: str, storage_options: Any = None, *, dry_run: bool = False, backup: bool = True) -> Migration:
    """Move the store at ``uri`` to the current format (see the module docstring); return what was found and done."""
    db = L.connect(str(uri), L.storage_options(storage_options), create=False)
    report = Migration(str(uri), store_format(db))
    if report.found != 1:
        return report
    names = L.table_names(db)
    legacy = [db.open_table(n) for n in LEGACY_TABLES if n in names]
    ledger_source = LEDGER_BACKUP if LEDGER_BACKUP in names else LEDGER if LEDGER in names else None
    old_ledger = db.open_table(ledger_source).to_arrow() if ledger_source else None
    report.counts = {t.name: t.count_rows() for t in legacy}
    report.counts["ledger rows"] = old_ledger.num_rows if old_ledger is not None else 0
    steps = [
        "copy the folder beside itself" if backup and "://" not in str(uri) else "keep the old tables until verified",
        f"write the facts and insights into one `{MEMORY}` table",
        "rewrite the chunk ledger with an id per unit",
        "drop the old tables",
    ]
    if dry_run:
        report.done = [f"would {s}" for s in steps]
        return report
    if backup and "://" not in str(uri):
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        target = Path(uri).expanduser().resolve()
        report.backup = str(target.with_name(f"{target.name}.backup-{stamp}"))
        shutil.copytree(target, report.backup)
        report.done.append(f"backed up to {report.backup}")
    if legacy:
        _memory(db, legacy, sum(report.counts[t.name] for t in legacy))
        report.done.append(f"{MEMORY}: {sum(report.counts[t.name] for t in legacy)} rows")
    if old_ledger is not None:
        report.done.append(f"{LEDGER}: {_ledger(db, old_ledger, ledger_source == LEDGER)} units")
    for table in legacy:
        db.drop_table(table.name)
    report.done.append("old tables dropped; the store is format 2")
    return report


def _memory(db: Any, legacy: list[Any], expected: int) -> None:
    """Create the ``memory`` table from the legacy tables' rows (kept when a stopped run already made it whole)."""
    parts = [t.to_arrow() for t in legacy]
    dims = parts[0].schema.field("vector").type.list_size
    meta = {k: v for p in parts for k, v in (p.schema.metadata or {}).items()}
    schema = item_schema(dims).with_metadata({**meta, FORMAT_KEY.encode(): str(FORMAT).encode()})
    if MEMORY in L.table_names(db):
        if db.open_table(MEMORY).count_rows() == expected:
            return
        db.drop_table(MEMORY)  # a stopped run's partial table (the old tables are still whole)
    data = pa.concat_tables([p.select(schema.names).cast(schema) for p in parts])
    db.create_table(MEMORY, data=data)
    if db.open_table(MEMORY).count_rows() != expected:
        raise ConfigurationError(
            f"migration: the new {MEMORY} table does not hold the {expected} old rows; nothing "
            "was dropped, run dualmem migrate again"
        )


def _ledger(db: Any, rows: pa.Table, from_live: bool) -> int:
    """Rewrite the ledger with non-null ids (the old rows kept in ``chunk_ledger_format1`` until it is verified)."""
    from dualmem.stores.ledger import SCHEMA, ledger_id

    if from_live:
        db.create_table(LEDGER_BACKUP, data=rows)
        db.drop_table(LEDGER)
    data = rows.to_pylist()
    for row in data:
        row["id"] = row.get("id") or ledger_id(ns_parse(row["namespace"]), row["chunk_id"])
        row["state"] = row.get("state") or "applied"
    if LEDGER in L.table_names(db):
        db.drop_table(LEDGER)
    db.create_table(LEDGER, data=pa.Table.from_pylist(data, schema=SCHEMA))
    if db.open_table(LEDGER).count_rows() != len(data):
        raise ConfigurationError(
            f"migration: the new ledger does not hold the {len(data)} old units; the old ones "
            f"are kept in {LEDGER_BACKUP}, run dualmem migrate again"
        )
    db.drop_table(LEDGER_BACKUP)
    return len(data)
