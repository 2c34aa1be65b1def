"""Gather each namespace's rows together, so a search that scans a namespace reads few, long runs.

Rows land in a table in commit order, so a long-running service interleaves
namespaces; a namespace's prefiltered scan then reads thousands of scattered
vectors. Gathering rewrites a scattered namespace's rows in one commit (an
upsert of the same values: they move into one new fragment, and compaction
keeps them adjacent). It runs under the namespace's write lease, so no writer
of that namespace races it, and rewrites only rows whose ``updated_at`` is still
the one it read, so a write that takes no lease (the LangGraph store API, the
memory tools) is never undone; readers see the rows before or after, never half.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import dualmem.stores._lance as L
from dualmem.stores._sql import ns_eq_sql, ns_parse

MAX_RUNS = 4  # a namespace whose rows form more runs than this (and more than one run per 1,000 rows) is gathered


def scattered(table: Any, max_runs: int = MAX_RUNS) -> list[str]:
    """Return the namespace keys whose rows are split into many runs of adjacent rows.

    A row's address is (fragment << 32 | offset); a run is a stretch of consecutive addresses.
    """
    data = table.search().select(["namespace"]).with_row_id(True).limit(None).to_arrow()
    addresses: dict[str, list[int]] = defaultdict(list)
    for ns, rowid in zip(data.column("namespace").to_pylist(), data.column("_rowid").to_pylist(), strict=True):
        addresses[ns].append(int(rowid))
    out = []
    for ns, rows in addresses.items():
        rows.sort()
        runs = 1 + sum(1 for a, b in zip(rows, rows[1:], strict=False) if b != a + 1)
        if runs > max(max_runs, len(rows) // 1000):
            out.append(ns)
    return sorted(out)


def gather(store: Any, table: Any, ns_key: str) -> None:
    """Rewrite one namespace's rows of ``table`` in one commit, under its write lease."""
    namespace = ns_parse(ns_key)
    with store.exclusive(namespace):
        data = table.search().where(ns_eq_sql(namespace)).limit(None).to_arrow()
        if data.num_rows:
            # only rows unchanged since they were read are rewritten: a store-API put or a tool's write
            # (which take no write lease) committed in between is never undone by these older values
            unchanged = "target.updated_at = source.updated_at"
            L.retry(lambda: table.merge_insert("pk").when_matched_update_all(where=unchanged).execute(data))


def gather_scattered(store: Any, table: Any) -> int:
    """Gather every scattered namespace of ``table``; return how many were gathered."""
    keys = scattered(table)
    for key in keys:
        gather(store, table, key)
    return len(keys)
