"""Private LanceDB helpers shared by the dual store and the LangGraph store.

Namespaces are stored as one string column: the JSON array of their parts
(``["sophie", "user"]``). Equality is exact, and a prefix matches at part
boundaries with ``ns = '["a"]' OR starts_with(ns, '["a", ')``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pyarrow as pa

from dualmem.errors import ConfigurationError

Namespace = tuple[str, ...]

_CONNECTIONS: dict[str, Any] = {}
_LOCK = threading.Lock()


def connect(uri: str) -> Any:
    """Return a (cached) LanceDB connection for ``uri``."""
    import lancedb

    with _LOCK:
        db = _CONNECTIONS.get(uri)
        if db is None:
            try:
                db = lancedb.connect(uri)
            except Exception as exc:  # noqa: BLE001 - re-raised with the fix
                raise ConfigurationError(
                    f"cannot open LanceDB at {uri!r} ({exc}); set DUALMEM_STORE_URI or store_uri= to a writable "
                    "directory or a LanceDB URI"
                ) from exc
            _CONNECTIONS[uri] = db
        return db


def table_names(db: Any) -> list[str]:
    """Return the table names of a connection (works across lancedb versions)."""
    if hasattr(db, "list_tables"):
        names: list[str] = []
        token = None
        while True:
            page = db.list_tables(page_token=token)
            names.extend(page.tables)
            token = page.page_token
            if not token:
                return names
    return list(db.table_names())


_TABLES: dict[tuple[str, str], Any] = {}


def open_or_create(db: Any, name: str, schema: pa.Schema) -> Any:
    """Open table ``name`` or create it empty with ``schema``.

    Handles are shared per process: a LanceDB table object does not see writes
    made through another handle, so every store of this process must use the same one.
    """
    key = (str(getattr(db, "uri", id(db))), name)
    with _LOCK:
        table = _TABLES.get(key)
        if table is None:
            if name in table_names(db):
                table = db.open_table(name)
            else:
                table = db.create_table(name, schema=schema, exist_ok=True)
            _TABLES[key] = table
        return table


def check_dims(table: Any, column: str, dims: int, uri: str) -> None:
    """Raise a ConfigurationError if ``column`` of ``table`` does not hold ``dims``-vectors."""
    field = table.schema.field(column)
    have = getattr(field.type, "list_size", None)
    if have is not None and have != dims:
        raise ConfigurationError(
            f"table {table.name!r} at {uri!r} stores {have}-dim vectors but the embedder makes {dims}-dim ones; "
            "use the embedder the store was built with (DUALMEM_EMBEDDER) or a fresh DUALMEM_STORE_URI"
        )


# --------------------------------------------------------------------------- SQL


def sql_str(value: str) -> str:
    """Return ``value`` as a quoted SQL string literal (quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_in(column: str, values: Iterable[str]) -> str:
    """Return ``column IN (...)`` for string values (``FALSE`` when empty)."""
    vals = [sql_str(v) for v in values]
    return f"{column} IN ({', '.join(vals)})" if vals else "FALSE"


def and_all(*clauses: str | None) -> str | None:
    """Join non-empty SQL clauses with AND."""
    parts = [f"({c})" for c in clauses if c]
    return " AND ".join(parts) if parts else None


# --------------------------------------------------------------------------- namespaces


def ns_key(namespace: Sequence[str]) -> str:
    """Encode a namespace tuple as its stored string key."""
    if isinstance(namespace, str):
        raise ConfigurationError(
            f"a namespace is a tuple of strings, got the string {namespace!r}; pass ({namespace!r},)"
        )
    return json.dumps([str(p) for p in namespace], ensure_ascii=False)


def ns_parse(key: str) -> Namespace:
    """Decode a stored namespace key."""
    return tuple(json.loads(key))


def ns_prefix_sql(prefix: Sequence[str], column: str = "namespace") -> str | None:
    """Return a SQL filter matching ``prefix`` and every namespace below it (None for the root)."""
    if not prefix:
        return None
    key = ns_key(prefix)
    return f"{column} = {sql_str(key)} OR starts_with({column}, {sql_str(key[:-1] + ', ')})"


def ns_eq_sql(namespace: Sequence[str], column: str = "namespace") -> str:
    """Return a SQL filter matching exactly ``namespace``."""
    return f"{column} = {sql_str(ns_key(namespace))}"


# --------------------------------------------------------------------------- scopes


def status_sql(status: str | None) -> str | None:
    """Return the SQL filter on ``status`` (None: any status)."""
    return f"status = {sql_str(status)}" if status else None


class Scope(NamedTuple):
    """The rows a search may return: one namespace, a status, an extra SQL filter, an event-time window."""

    namespace: Namespace
    status: str | None = "active"
    where: str | None = None
    since: str | None = None
    until: str | None = None

    def sql(self) -> str:
        """Return the SQL prefilter of this scope."""
        return (
            and_all(
                ns_eq_sql(self.namespace),
                status_sql(self.status),
                self.where,
                f"event_time >= {sql_str(self.since)}" if self.since else None,
                f"event_time <= {sql_str(self.until)}" if self.until else None,
            )
            or ""
        )


def rrf_fuse(rankings: list[list[dict[str, Any]]], k: int, rrf_k: int = 60) -> list[tuple[dict[str, Any], float]]:
    """Fuse ranked row lists by reciprocal rank (``sum 1 / (rrf_k + rank)``); return the top ``k`` rows."""
    fused: dict[str, float] = {}
    rows: dict[str, dict[str, Any]] = {}
    for ranked in rankings:
        for rank, row in enumerate(ranked, start=1):
            fused[row["id"]] = fused.get(row["id"], 0.0) + 1.0 / (rrf_k + rank)
            rows.setdefault(row["id"], row)
    for row in rows.values():
        row.pop("_distance", None)
        row.pop("_score", None)
    order = sorted(fused, key=lambda i: -fused[i])[:k]
    return [(rows[i], fused[i]) for i in order]


# --------------------------------------------------------------------------- misc


def utc(value: datetime | None) -> datetime | None:
    """Return ``value`` as an aware UTC datetime (naive values are taken as UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def query_rows(table: Any, where: str | None, columns: list[str], limit: int | None = None) -> list[dict[str, Any]]:
    """Return rows matching ``where`` (all of them unless ``limit``) with only ``columns``."""
    query = table.search()
    if where:
        query = query.where(where)
    return query.select(columns).limit(limit).to_arrow().to_pylist()


# --------------------------------------------------------------------------- indexes


def index_name(table: Any, column: str) -> str | None:
    """Return the name of the index on ``column`` (None if there is none)."""
    for index in table.list_indices():
        if list(index.columns) == [column]:
            return index.name
    return None


def has_index(table: Any, column: str) -> bool:
    """Return True if ``column`` has an index."""
    return index_name(table, column) is not None


def unindexed_rows(table: Any, column: str) -> int:
    """Return how many rows the index on ``column`` does not cover yet."""
    name = index_name(table, column)
    return table.index_stats(name).num_unindexed_rows if name else table.count_rows()


def ensure_base_indexes(table: Any) -> None:
    """Create the scalar (id, namespace, status, event_time) and full-text (text) indexes a table lacks."""
    from lancedb.index import FTS, Bitmap, BTree

    wanted = {
        "id": BTree(),
        "namespace": Bitmap(),
        "status": Bitmap(),
        "event_time": BTree(),
        "text": FTS(with_position=False),
    }
    have = {tuple(i.columns) for i in table.list_indices()}
    for column, config in wanted.items():
        if (column,) not in have:
            table.create_index(column, config=config)


def build_vector_index(table: Any, rows: int) -> None:
    """Build a cosine IVF_PQ index sized for ``rows`` rows."""
    from lancedb.index import IvfPq

    dims = table.schema.field("vector").type.list_size
    partitions = max(1, min(1024, int(rows**0.5)))
    sub_vectors = next(d for d in (dims // 8, dims // 4, dims // 2, dims, 1) if d >= 1 and dims % d == 0)
    table.create_index(
        "vector", config=IvfPq(distance_type="cosine", num_partitions=partitions, num_sub_vectors=sub_vectors)
    )
