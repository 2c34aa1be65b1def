"""Make deleted rows physically gone from a LanceDB table: its data files, indexes and old versions.

A LanceDB delete only marks rows deleted: their bytes stay in the fragment's
data file (until compaction, which skips fragments with few deletions), in the
index files built over them (the full-text index holds their terms) and in
every older version of the table. :func:`purge` removes all of it with the
public LanceDB API:

1. **rewrite** — every row still alive in a fragment that held a deleted row is
   rewritten by itself (``update(values_sql={column: column})`` over that fragment's
   row ids, ``column`` a non-key column): same content and stamps, in a new
   fragment; the old fragment is then wholly deleted and leaves the table;
2. **reindex** — every index of the table is built again from the rows now
   in it (``create_index(..., replace=True)``);
3. **clean** — ``optimize(cleanup_older_than=0)`` compacts and drops every
   version but the latest, with the data, deletion and index files only they used.

Invariants: no row's content or ``updated_at`` changes, rows written meanwhile
by other processes are kept (each step is one optimistic commit, redone when it
loses a race); readers see the table whole before and after each step. Step 3
has no grace period: a reader or writer in the middle of an operation on an
older version may fail that one operation (a retry reads the latest version).
Files that no version ever referenced (left by commits that lost a race) are
kept unless ``delete_unverified`` is set, which is safe only when no other
process writes to the table.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import dualmem.stores._lance as L

_KINDS = {"btree": "BTREE", "bitmap": "BITMAP", "fts": "FTS", "inverted": "FTS"}


def fragments(table: Any, where: str, key: str) -> set[int]:
    """Return the ids of the fragments holding rows that match ``where`` (``key``: any column of the table)."""
    rows = table.search().where(where).select([key]).with_row_id(True).limit(None).to_arrow()
    return {int(r) >> 32 for r in rows.column("_rowid").to_pylist()}


def rewrite(table: Any, frags: Iterable[int], column: str) -> int:
    """Rewrite the live rows of ``frags`` into new fragments (``column`` set to itself: content unchanged); return how
    many rows moved."""
    moved = 0
    for frag in sorted(set(frags)):
        where = f"_rowid >= {frag << 32} AND _rowid < {(frag + 1) << 32}"
        moved += int(L.retry(lambda w=where: table.update(where=w, values_sql={column: column})).rows_updated)  # type: ignore[misc]
    return moved


def reindex(table: Any) -> int:
    """Build every scalar and full-text index of ``table`` again from its current rows; return how many."""
    configs = {}
    for index in table.list_indices():
        kind = _KINDS.get(str(index.index_type).lower())
        if kind is None or len(index.columns) != 1:
            raise RuntimeError(
                f"table {table.name!r} has an index DualMem cannot rebuild: {index.name} ({index.index_type})"
            )
        configs[index.columns[0]] = kind
    for column, config in L.base_index_configs(configs).items():
        L.retry(lambda c=column, cfg=config: table.create_index(c, config=cfg, replace=True))  # type: ignore[misc]
    return len(configs)


def clean(table: Any, *, delete_unverified: bool = False) -> None:
    """Compact ``table`` and drop every version but the latest (no grace period: see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # LanceDB warns that readers of older versions may fail: documented
        L.retry(lambda: table.optimize(cleanup_older_than=timedelta(0), delete_unverified=delete_unverified))


def purge(table: Any, frags: Iterable[int], column: str, *, delete_unverified: bool = False) -> dict[str, int]:
    """Rewrite ``frags`` (by a non-key ``column``), rebuild the indexes and drop old versions of ``table``; return
    what was done."""
    moved = rewrite(table, frags, column)
    rebuilt = reindex(table)
    clean(table, delete_unverified=delete_unverified)
    return {"rows_rewritten": moved, "indexes_rebuilt": rebuilt}
