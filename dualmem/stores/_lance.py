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
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from dualmem.config import STORE_SCHEMES as SCHEMES
from dualmem.errors import ConfigurationError

T = TypeVar("T")

_CONFLICT_MARKERS = (
    "commit conflict", "preempted", "incompatible transaction", "retryable", "concurrent transaction",
    "too many concurrent writers",
)  # fmt: skip


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


def connect(uri: str, options: Mapping[str, str] | None = None) -> Any:
    """Open a LanceDB connection whose every read sees the latest committed version."""
    import lancedb

    uri = check_uri(uri)
    try:
        return lancedb.connect(uri, read_consistency_interval=timedelta(0), storage_options=dict(options or {}) or None)
    except Exception as exc:  # noqa: BLE001 - re-raised with the fix
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
        except Exception as exc:  # noqa: BLE001 - only conflicts are retried
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
            if name in table_names(db):
                return db.open_table(name)
            return db.create_table(name, data=data, schema=schema if data is None else None, exist_ok=True)
        except Exception as exc:  # noqa: BLE001 - only creation races are retried
            text = str(exc).lower()
            racing = is_conflict(exc) or "not found" in text or "already exists" in text
            if not racing or attempt == 59:
                raise
            time.sleep(0.01 * (1 + random.random()) * min(attempt + 1, 20))  # another process is creating it
    raise AssertionError("unreachable")


def migrate_columns(table: Any, schema: pa.Schema, sql: Mapping[str, str]) -> None:
    """Add columns of ``schema`` that an older table lacks, computed by the SQL expressions in ``sql``."""
    have = set(table.schema.names)
    missing = {name: expr for name, expr in sql.items() if name not in have and name in schema.names}
    if missing:
        try:
            retry(lambda: table.add_columns(missing))
        except Exception as exc:  # noqa: BLE001 - another process may have added them
            if not set(missing) <= set(table.schema.names):
                raise ConfigurationError(
                    f"table {table.name!r} is from an older DualMem and could not be upgraded ({exc}); "
                    "re-ingest into a fresh DUALMEM_STORE_URI"
                ) from exc


def check_dims(table: Any, column: str, dims: int, uri: str) -> None:
    """Raise a ConfigurationError if ``column`` of ``table`` does not hold ``dims``-vectors."""
    field = table.schema.field(column)
    have = getattr(field.type, "list_size", None)
    if have is not None and have != dims:
        raise ConfigurationError(
            f"table {table.name!r} at {uri!r} stores {have}-dim vectors but the embedder makes {dims}-dim ones; "
            "use the embedder the store was built with (DUALMEM_EMBEDDER) or a fresh DUALMEM_STORE_URI"
        )


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


def ensure_indexes(table: Any, wanted: Mapping[str, Any]) -> None:
    """Create the indexes of ``wanted`` (column -> lancedb index config) that ``table`` lacks.

    Safe when processes race: a creation that loses to another process's is
    checked again and not repeated once the index exists.
    """
    for column, config in wanted.items():
        for attempt in range(30):
            if has_index(table, column):
                break
            try:
                table.create_index(column, config=config)
                break
            except Exception as exc:  # noqa: BLE001 - only races are retried
                if not is_conflict(exc) or attempt == 29:
                    raise
                time.sleep(0.01 * (1 + random.random()) * (attempt + 1))


def base_index_configs(columns: Mapping[str, str]) -> dict[str, Any]:
    """Return lancedb index configs for column -> "BTREE" | "BITMAP" | "FTS"."""
    from lancedb.index import FTS, Bitmap, BTree

    make = {"BTREE": BTree, "BITMAP": Bitmap, "FTS": lambda: FTS(with_position=False)}
    return {column: make[kind]() for column, kind in columns.items()}


def build_vector_index(table: Any, rows: int) -> None:
    """Build a cosine IVF_PQ index sized for ``rows`` rows."""
    from lancedb.index import IvfPq

    dims = table.schema.field("vector").type.list_size
    partitions = max(1, min(1024, int(rows**0.5)))
    sub_vectors = next(d for d in (dims // 8, dims // 4, dims // 2, dims, 1) if d >= 1 and dims % d == 0)
    config = IvfPq(distance_type="cosine", num_partitions=partitions, num_sub_vectors=sub_vectors)
    ensure_indexes(table, {"vector": config})


class AutoOptimize:
    """Fold a table's small fragments after every ``every`` commits made through this object, in the background.

    Every commit adds a small fragment (and a version); a table of thousands of tiny
    fragments makes every scan slow. The store that makes the commits starts a
    maintenance run (compaction, index update, old versions dropped) in a background
    thread now and then, so neither its writes nor anyone's reads wait for it.
    """

    def __init__(self, every: int = 64) -> None:
        self.every = every
        self._counts: dict[int, int] = {}
        self._running: set[int] = set()
        self._lock = threading.Lock()

    def committed(self, table: Any) -> None:
        """Count one commit to ``table``; start its maintenance when the count reaches a multiple of ``every``."""
        with self._lock:
            count = self._counts[id(table)] = self._counts.get(id(table), 0) + 1
            if count % self.every or id(table) in self._running:
                return
            self._running.add(id(table))
        threading.Thread(target=self._run, args=(table,), name="lancedb-maintenance", daemon=True).start()

    def _run(self, table: Any) -> None:
        try:
            optimize(table, keep_versions_for=timedelta(minutes=10))
        except Exception:  # noqa: BLE001 - maintenance only: started again after the next commits
            pass
        finally:
            with self._lock:
                self._running.discard(id(table))


def optimize(table: Any, keep_versions_for: timedelta | None = None) -> None:
    """Compact ``table``, fold new rows into its indexes and drop versions older than ``keep_versions_for``."""
    if keep_versions_for is None:
        retry(table.optimize)
    else:
        retry(lambda: table.optimize(cleanup_older_than=keep_versions_for))


# --------------------------------------------------------------------------- rows


def _handle(table: Any) -> Any:
    """Return the async table a LanceDB sync table wraps (None for other table kinds).

    Reads go through it on LanceDB's own event loop: the sync query builder re-reads the
    table schema (a latest-version check each) two or three times per query, which cost
    1.5-4.5 ms of every read here (lancedb 0.40).
    """
    handle = getattr(table, "_table", None)
    return handle if handle is not None and hasattr(handle, "query") and hasattr(handle, "version") else None


def _run(query: Any) -> pa.Table:
    from lancedb.background_loop import LOOP

    return LOOP.run(query.to_arrow())


def scan(table: Any, where: str | None, columns: list[str], limit: int | None = None, offset: int | None = None) -> pa.Table:
    """Return the rows matching ``where`` (all of them unless ``limit``; from the ``offset``-th on) with only ``columns``."""
    handle = _handle(table)
    query = table.search() if handle is None else handle.query()
    if where:
        query = query.where(where)
    query = query.select(columns)
    if offset:
        query = query.offset(offset)
    if handle is None:
        return query.limit(limit).to_arrow()
    return _run(query if limit is None else query.limit(limit))


def nearest(
    table: Any, vector: Any, k: int, where: str | None, columns: list[str], *, distance: str = "cosine", exact: bool = False,
    nprobes: int | None = None, refine_factor: int | None = None, unit: bool = False, row_ids: bool = False,
) -> pa.Table:  # fmt: skip
    """Return the ``k`` rows nearest ``vector`` (LanceDB ``distance`` type) among those matching ``where``
    (prefiltered), with ``columns`` and ``_distance``; ``exact`` scans instead of using a vector index.

    ``unit`` says the table's vectors are unit-normalised: an exact cosine search then runs
    LanceDB's L2 kernel on the unit query (about 2 ms faster per 10k float16 rows; the
    order is the cosine order up to float16 rounding) for ``k + 10`` rows, which are
    scored by exact cosine and cut to ``k``.
    """
    if unit and exact and distance == "cosine" and k > 0:
        q = np.asarray(vector, dtype=np.float32)
        q = q / (float(np.linalg.norm(q)) or 1.0)
        wanted = columns if "vector" in columns else [*columns, "vector"]
        found = nearest(table, q, k + 10, where, wanted, distance="l2", exact=True, row_ids=True)
        if found.num_rows == 0:
            return found.drop_columns(["_rowid"])
        flat = found.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
        vecs = np.asarray(flat, dtype=np.float32).reshape(found.num_rows, -1)
        cosine = (vecs @ q) / np.maximum(np.linalg.norm(vecs, axis=1), 1e-12)
        order = np.lexsort((found.column("_rowid").to_numpy(), -cosine))[:k]  # ties: table order, as LanceDB's cosine
        found = found.take(pa.array(order)).set_column(
            found.schema.get_field_index("_distance"), "_distance", pa.array((1.0 - cosine[order]).astype(np.float32))
        )
        return found.drop_columns(["_rowid"] if "vector" in columns else ["_rowid", "vector"])
    handle = _handle(table)
    if handle is None:
        query = table.search(list(vector), vector_column_name="vector").distance_type(distance)
        if where:
            query = query.where(where, prefilter=True)
    else:
        query = handle.query().nearest_to(list(vector)).column("vector").distance_type(distance)
        if where:
            query = query.where(where)
    if exact:
        query = query.bypass_vector_index()
    if nprobes is not None:
        query = query.nprobes(nprobes)
    if refine_factor is not None:
        query = query.refine_factor(refine_factor)
    query = query.select([*columns, "_distance"]).limit(k)
    if row_ids:
        query = query.with_row_id(True) if handle is None else query.with_row_id()
    return query.to_arrow() if handle is None else _run(query)


def text_search(table: Any, text: str, k: int, where: str | None, columns: list[str]) -> pa.Table:
    """Return the ``k`` best full-text (BM25) rows of the ``text`` column matching ``where`` (prefiltered), with ``_score``."""
    handle = _handle(table)
    if handle is None:
        query = table.search(text, query_type="fts", fts_columns="text")
        if where:
            query = query.where(where, prefilter=True)
        return query.select([*columns, "_score"]).limit(k).to_arrow()
    query = handle.query().nearest_to_text(text, columns="text")
    if where:
        query = query.where(where)
    return _run(query.select([*columns, "_score"]).limit(k))


def query_rows(table: Any, where: str | None, columns: list[str], limit: int | None = None) -> list[dict[str, Any]]:
    """Return rows matching ``where`` (all of them unless ``limit``) with only ``columns``."""
    return scan(table, where, columns, limit).to_pylist()


def utc(value: datetime | None) -> datetime | None:
    """Return ``value`` as an aware UTC datetime (naive values are taken as UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
