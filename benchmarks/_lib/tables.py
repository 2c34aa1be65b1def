"""Counting a LanceDB store's commits: every table's version, read the same way by every benchmark."""

from __future__ import annotations

from typing import Any


def table_versions(db: Any) -> dict[str, int]:
    """Return each table's current version in a LanceDB connection (a commit adds one)."""
    names = db.list_tables().tables if hasattr(db, "list_tables") else db.table_names()
    return {name: db.open_table(name).version for name in names}
