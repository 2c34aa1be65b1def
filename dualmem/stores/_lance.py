"""LanceDB plumbing shared by every store: fresh connections, safe table/index creation, retries.

Freshness: every connection is opened with ``read_consistency_interval=0``, so
each read first checks the table's latest version and sees every commit that
finished before it began, from any process (LanceDB's default never looks
again). Nothing here caches connections or table handles across stores.

Concurrency: LanceDB commits optimistically; a commit that loses a race raises
a "commit conflict" error, and nothing of it is visible. :func:`retry` redoes
such an operation with jittered backoff, which is safe for the stores' writes
(keyed upserts, deletes, updates). Tables and indexes are created so that
several processes opening a fresh store at once all succeed.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from dualmem.config import STORE_SCHEMES as SCHEMES
from dualmem.errors import ConfigurationError
from dualmem.stores._rows import one_per_key
from dualmem.stores._sql import sql_in

T = TypeVar("T")
KEEP_VERSIONS = timedelta(minutes=10)  # maintenance keeps versions this recent: readers in flight may still read them
TIDY_EVERY = 64  # the writer of every 64th memory table version tidies the store (compaction + cleanup)
TIDY_KEEP = timedelta(minutes=1)  # a tidy keeps versions this recent (a read lasting longer may fail; none does)

_CONFLICT_MARKERS = (
    "commit conflict",
    "preempted",
    "incompatible transaction",
    "retryable",
    "concurrent transaction",
    "too many concurrent writers",
)


def storage_options(raw: str | Mapping[str, str] | None) -> dict[str, str] | None:
    """Parse the ``store_options`` setting (a JSON object of LanceDB storage options)."""
    if not raw:
        return None
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items()}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"store_options is not JSON ({exc.msg}); set DUALMEM_STORE_OPTIONS to an object such as "
            '\'{"endpoint": "http://127.0.0.1:9000", "allow_http": "true"}\''
        ) from exc
    if not isinstance(parsed, dict):
        raise ConfigurationError("store_options must be a JSON object of LanceDB storage options (strings)")
    return {str(k): str(v) for k, v in parsed.items()}


def check_uri(uri: str) -> str:
    """Return ``uri`` if it can hold a LanceDB store, creating a local folder; else raise with the fix."""
    uri = str(uri)
    if "://" in uri:
        scheme = uri.split("://", 1)[0].lower()
        if scheme not in SCHEMES:
            raise ConfigurationError(
                f"store URI {uri!r} has the unknown scheme {scheme!r}; use a local folder or one of "
                f"{', '.join(s + '://' for s in SCHEMES)}"
            )
        if scheme != "file":
            return uri
        path = Path(uri.split("://", 1)[1])
    else:
        path = Path(uri).expanduser()
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            raise ConfigurationError(
                f"store path {str(path)!r} is under {str(parent)!r}, which is a file; set DUALMEM_STORE_URI or "
                "--store to a folder"
            )
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{random.getrandbits(32):08x}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write the store at {str(path)!r} ({exc.strerror or exc}); set DUALMEM_STORE_URI or --store "
            "to a writable folder"
        ) from exc
    return uri


def connect(uri: str, options: Mapping[str, str] | None = None, *, create: bool = True) -> Any:
    """Open a LanceDB connection whose every read sees the latest committed version (``create``: make a local folder)."""
    import lancedb

    uri = check_uri(uri) if create else str(uri)
    try:
        return lancedb.connect(uri, read_consistency_interval=timedelta(0), storage_options=dict(options or {}) or None)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot open LanceDB at {uri!r} ({exc}); set DUALMEM_STORE_URI or store_uri= to a writable folder or "
            "a LanceDB URI (object stores take DUALMEM_STORE_OPTIONS or the usual AWS_* variables)"
        ) from exc


def is_conflict(exc: BaseException) -> bool:
    """Return True for LanceDB's lost-commit-race errors (safe to retry)."""
    text = str(exc).lower()
    return any(marker in text for marker in _CONFLICT_MARKERS)


def retry(fn: Callable[[], T], *, attempts: int = 30) -> T:
    """Run ``fn``, redoing it with jittered backoff while it loses commit races."""
    delay = 0.005
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_conflict(exc) or attempt == attempts - 1:
                raise
            time.sleep(delay * (1.0 + random.random()))
            delay = min(delay * 2, 0.25)
    raise AssertionError("unreachable")


def table_names(db: Any) -> list[str]:
    """Return the table names of a connection."""
    names: list[str] = []
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.extend(page.tables)
        token = page.page_token
        if not token:
            return names


def open_or_create(db: Any, name: str, schema: pa.Schema, data: pa.Table | None = None) -> Any:
    """Open table ``name`` or create it (with ``data`` if given), safe when processes race to create it.

    When several processes create the table at once exactly one creation wins,
    the others open the winner's table (``data`` is written once, atomically).
    """

    for attempt in range(60):
        try:
            return db.open_table(name)  # the common case: one call
        except Exception as exc:
            if not _missing(exc):
                raise
        try:
            return db.create_table(name, data=data, schema=schema if data is None else None, exist_ok=True)
        except Exception as exc:
            text = str(exc).lower()
            racing = (
                is_conflict(exc) or "not found" in text or "already exists" in text or "does not match existing" in text
            )
            if not racing or attempt == 59:
                raise
            time.sleep(0.01 * (1 + random.random()) * min(attempt + 1, 20))  # another process is creating it
    raise AssertionError("unreachable")


def _missing(exc: Exception) -> bool:
    """Whether ``exc`` says the table does not exist."""
    return isinstance(exc, FileNotFoundError) or "not found" in str(exc).lower()


def migrate_columns(table: Any, schema: pa.Schema, sql: Mapping[str, str]) -> None:
    """Add columns of ``schema`` that an older table lacks, computed by the SQL expressions in ``sql``."""
    have = set(table.schema.names)
    missing = {name: expr for name, expr in sql.items() if name not in have and name in schema.names}
    if missing:
        try:
            retry(lambda: table.add_columns(missing))
        except Exception as exc:
            if not set(missing) <= set(table.schema.names):
                raise ConfigurationError(
                    f"table {table.name!r} is from an older DualMem and could not be upgraded ({exc}); "
                    "re-ingest into a fresh DUALMEM_STORE_URI"
                ) from exc


def check_dims(table: Any, column: str, dims: int, uri: str, schema: pa.Schema | None = None) -> None:
    """Raise a ConfigurationError if ``column`` of ``table`` (its ``schema``, if read) does not hold ``dims``-vectors."""
    field = (table.schema if schema is None else schema).field(column)
    have = getattr(field.type, "list_size", None)
    if have is not None and have != dims:
        raise ConfigurationError(
            f"table {table.name!r} at {uri!r} stores {have}-dim vectors but the embedder makes {dims}-dim ones; "
            "use the embedder the store was built with (DUALMEM_EMBEDDER) or a fresh DUALMEM_STORE_URI"
        )


# --------------------------------------------------------------------------- indexes


def indexed_columns(table: Any) -> set[str]:
    """Return the columns of ``table`` that have a single-column index (one listing)."""
    return {index.columns[0] for index in table.list_indices() if len(index.columns) == 1}


def ensure_indexes(table: Any, wanted: Mapping[str, Any]) -> None:
    """Create the indexes of ``wanted`` (column -> lancedb index config) that ``table`` lacks.

    One listing of the table's indexes when none is missing. Safe when processes race: a creation that loses to
    another process's is checked again and not repeated once the index exists.
    """
    have = indexed_columns(table)
    for column, config in wanted.items():
        for attempt in range(30):
            if column in have:
                break
            try:
                table.create_index(column, config=config)
                break
            except Exception as exc:
                if not is_conflict(exc) or attempt == 29:
                    raise
                time.sleep(0.01 * (1 + random.random()) * (attempt + 1))
                have = indexed_columns(table)


def base_index_configs(columns: Mapping[str, str]) -> dict[str, Any]:
    """Return lancedb index configs for column -> "BTREE" | "BITMAP" | "FTS"."""
    from lancedb.index import FTS, Bitmap, BTree

    make = {"BTREE": BTree, "BITMAP": Bitmap, "FTS": lambda: FTS(with_position=False)}
    return {column: make[kind]() for column, kind in columns.items()}


def ensure_primary_key(table: Any, column: str, schema: pa.Schema | None = None) -> pa.Schema:
    """Declare ``column`` the table's (unenforced) primary key, unless it already is; return the table's schema with
    it declared (``schema``: the table's, if read already — no read then when the key is declared).

    LanceDB then detects concurrent ``merge_insert`` commits that insert the same key (from
    threads, processes or machines) and redoes the losing one as an update, so a keyed upsert
    never leaves two rows of one key. Without it, two writers inserting a new key both succeed.
    """
    schema = table.schema if schema is None else schema
    if _is_key(schema, column):
        return schema
    try:
        retry(lambda: table.set_unenforced_primary_key(column))
    except Exception:
        if not _is_key(table.schema, column):
            raise
    return table.schema


def _is_key(schema: pa.Schema, column: str) -> bool:
    return any(k.startswith(b"lance-schema:unenforced-primary-key") for k in (schema.field(column).metadata or {}))


def optimize(table: Any, keep_versions_for: timedelta | None = None) -> None:
    """Compact ``table``, fold new rows into its indexes and drop versions older than ``keep_versions_for``."""
    if keep_versions_for is None:
        retry(table.optimize)
    else:
        retry(lambda: table.optimize(cleanup_older_than=keep_versions_for))


# --------------------------------------------------------------------------- rows


def scan(
    table: Any, where: str | None, columns: list[str], limit: int | None = None, *, rowid: bool = False
) -> pa.Table:
    """Return the rows matching ``where`` (all of them unless ``limit``) with only ``columns`` (then ``_rowid``, each
    row's address, with ``rowid``)."""
    query = table.search()
    if where:
        query = query.where(where)
    return query.select(columns).with_row_id(rowid).limit(limit).to_arrow()


def take(table: Any, addresses: Sequence[int], columns: list[str]) -> pa.Table:
    """Return the rows still current at these ``_rowid`` addresses with ``columns`` (a row replaced or deleted since
    is not returned; fragments are immutable and their ids never reused, so an address never names another row)."""
    return table.take_row_ids(sorted(set(addresses))).select(columns).to_arrow()


def query_rows(table: Any, where: str | None, columns: list[str], limit: int | None = None) -> list[dict[str, Any]]:
    """Return rows matching ``where`` (all of them unless ``limit``) with only ``columns``."""
    return scan(table, where, columns, limit).to_pylist()


def repair_duplicates(table: Any, key: str) -> int:
    """Delete all but the latest row of every key that has several (one commit); return how many rows went."""
    keys = scan(table, None, [key]).column(key)
    counts = pc.value_counts(keys)
    dup = [v["values"] for v in counts.to_pylist() if v["counts"] > 1]
    if not dup:
        return 0
    stamp = "updated_at" if "updated_at" in table.schema.names else "applied_at"
    rows = table.search().where(sql_in(key, dup)).select([key, stamp]).with_row_id(True).to_arrow()
    keep = one_per_key(rows, key, stamp)
    losers = sorted(set(rows.column("_rowid").to_pylist()) - set(keep.column("_rowid").to_pylist()))
    if not losers:
        return 0
    for start in range(0, len(losers), 10_000):
        part = ", ".join(str(r) for r in losers[start : start + 10_000])
        retry(lambda p=part: table.delete(f"_rowid IN ({p})"))  # type: ignore[misc]
    return len(losers)
