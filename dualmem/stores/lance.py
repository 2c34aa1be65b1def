"""The LanceDB backend of the dual store: a local folder or object storage, shared by many processes and machines.

Layout at ``uri``: the table ``memory`` (one row per ``MemoryItem``, keyed by
``pk`` = namespace + id, declared LanceDB's unenforced primary key so that
concurrent keyed upserts never insert a key twice), ``chunk_ledger``
(:mod:`~dualmem.stores.ledger`) and the write leases ``namespace_leases`` and ``write_leases``
(:mod:`~dualmem.stores.leases`).
Stores of older versions (tables ``facts`` and ``insights``) are copied into
``memory`` once, when first opened.

Every read goes to LanceDB through its public API with
``read_consistency_interval=0`` (each read sees every commit that finished
before it began, from any process); this object caches no rows. A search reads
the namespace's rows of the kind and status in one scan (bitmap indexes on
``namespace``, ``kind`` and ``status``) and ranks them exactly with the one
ranker of :mod:`~dualmem.stores.ranking` (cosine, DualMem's BM25, their
reciprocal-rank fusion), as the in-memory backend and retrieval's snapshots do.
Indexes: BTREE on ``pk``, ``id`` and ``event_time``, BITMAP on ``namespace``,
``kind`` and ``status`` (a full-text index on ``text`` that older versions made
is left as it is, and no longer read). ``maintain`` repairs
legacy duplicate rows, gathers each namespace whose rows lie scattered over
many fragments into one (a reader taking a namespace then reads one contiguous
run instead of pages across the whole table: in a 1M-row table, the difference
between a first search in tens of milliseconds and one in a few), compacts,
folds new rows into the indexes and drops old versions.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import dualmem.stores._lance as L
from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.schema import utcnow
from dualmem.stores import erase, ranking
from dualmem.stores._put import put_rows
from dualmem.stores._rows import ITEM_COLUMNS, STAMP_COLUMNS, item_schema, one_per_key, row_to_item, vectors_of
from dualmem.stores._sql import and_all, ns_eq_sql, ns_parse, ns_prefix_sql, row_key, sql_in, sql_str
from dualmem.stores.contract import (
    CountItems,
    DeleteItems,
    DualStore,
    GetItems,
    ListNamespaces,
    MemoryOp,
    Namespace,
    PutItems,
    ScanItems,
    SearchItems,
    SetStatus,
)
from dualmem.stores.leases import Lease, Leases
from dualmem.stores.ledger import LanceLedger
from dualmem.stores.migrate import FORMAT, FORMAT_KEY, LEGACY_TABLES, check_format
from dualmem.stores.results import ScoredItem

TABLE = "memory"
INDEXES = {
    "pk": "BTREE",
    "id": "BTREE",
    "namespace": "BITMAP",
    "kind": "BITMAP",
    "status": "BITMAP",
    "event_time": "BTREE",
}
EMBEDDER_KEY = "dualmem.embedder"  # schema metadata: the embedder spec the store was created with


class LanceDualStore(DualStore):
    """Facts and insights in one LanceDB table (see the module docstring).

    ``embeddings``: an embeddings object, or an embedder spec (``bundled:all-MiniLM-L6-v2``, ``hash:64``…) loaded
    the first time a text or query must be embedded — listing, counting and reading never load it.
    """

    def __init__(
        self,
        uri: str,
        embeddings: Any,
        *,
        dims: int | None = None,
        storage_options: Mapping[str, str] | str | None = None,
        lease_ttl_s: float = 60.0,
        lease_wait_s: float = 900.0,
    ) -> None:
        if embeddings is None:
            raise ConfigurationError(
                "LanceDualStore needs an embeddings object or spec; use open_store(settings) for the configured one"
            )
        self.uri = str(uri)
        self._embeddings = embeddings
        self.storage_options = L.storage_options(storage_options)
        self._db = L.connect(self.uri, self.storage_options)
        names = L.table_names(self._db)
        check_format(self._db, self.uri, names)  # an earlier layout is refused in one line naming `dualmem migrate`
        spec = embeddings if isinstance(embeddings, str) else getattr(embeddings, "spec", None)
        stored = self._db.open_table(TABLE) if TABLE in names else None
        have = stored.schema if stored is not None else None  # read once: a call (a request on object storage)
        self.dims = dims or (_vector_size(have) if have is not None else None) or 0
        if not self.dims:  # a fresh store: its width is the embedder's, so the embedder loads now
            self._embeddings = _loaded(embeddings)
            self.dims = _dims(self._embeddings)
        elif not isinstance(embeddings, str):  # an embedder object is checked now, a spec when it loads
            self._check(embeddings)
        schema = item_schema(self.dims).with_metadata(
            {FORMAT_KEY: str(FORMAT), **({EMBEDDER_KEY: spec} if spec else {})}
        )
        self.table = stored if stored is not None else L.open_or_create(self._db, TABLE, schema)
        have = have if have is not None else self.table.schema
        L.check_dims(self.table, "vector", self.dims, self.uri, have)
        have = L.ensure_primary_key(self.table, "pk", have)
        L.ensure_indexes(self.table, L.base_index_configs(INDEXES))
        self._schema = pa.schema([have.field(n) for n in [*ITEM_COLUMNS, "vector"]])
        self.ledger: LanceLedger = LanceLedger(self._db)
        self.leases = Leases(self._db, ttl_s=lease_ttl_s, wait_s=lease_wait_s)
        self._last = utcnow()
        self.tidy_every, self.tidy_keep = L.TIDY_EVERY, L.TIDY_KEEP

    @property
    def embeddings(self) -> Any:  # type: ignore[override]
        """The store's embedder (a spec given at construction is loaded now, once)."""
        if isinstance(self._embeddings, str):
            self._embeddings = self._check(_loaded(self._embeddings), self._embeddings)
        return self._embeddings

    def _check(self, embeddings: Any, spec: str | None = None) -> Any:
        """Return ``embeddings`` if its vectors have the stored width, else raise naming the fix."""
        if (made := _dims(embeddings)) != self.dims:
            raise ConfigurationError(
                f"the store at {self.uri!r} holds {self.dims}-dim vectors but the embedder {spec or type(embeddings).__name__!r} "
                f"makes {made}-dim ones; use the embedder the store was written with (DUALMEM_EMBEDDER) or a fresh store"
            )
        return embeddings

    @classmethod
    def from_settings(cls, settings: Settings | None = None, embeddings: Any = None) -> LanceDualStore:
        """Open the store at ``settings.store_uri`` with the settings' embedder (or ``embeddings``), loaded when first needed."""
        s = Settings.resolve(settings)
        return cls(
            s.store_uri,
            embeddings if embeddings is not None else s.embedder,
            storage_options=s.store_options,
            lease_ttl_s=s.lease_ttl_s,
            lease_wait_s=s.lease_wait_s,
        )

    # ------------------------------------------------------------------ contract

    def version(self) -> int:
        """Return the memory table's latest version (any process's commit moves it)."""
        return int(self.table.version)

    @contextmanager
    def exclusive(
        self,
        namespace: Namespace,
        owner: str | None = None,
        wait_s: float | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> Iterator[Lease | None]:
        """Hold the namespace's write lease for the block (one writer per namespace, any process)."""
        with self.leases.hold(tuple(namespace), owner, wait_s, give_up) as lease:
            yield lease

    def maintain(self) -> dict[str, int]:
        """Repair duplicate rows of one key left by older versions (keeping the latest), compact every table,
        fold new rows into the indexes and drop versions older than ten minutes; return what was done."""
        repaired = L.repair_duplicates(self.table, "pk") + L.repair_duplicates(self.ledger.table, "id")
        gathered = sum(gather(self.table, key) for key in _namespace_keys(self.table))
        for table in (self.table, self.ledger.table, *self.leases.tables):
            L.optimize(table, keep_versions_for=L.KEEP_VERSIONS)
        return {"duplicates_removed": repaired, "namespaces_gathered": gathered, "rows": self.table.count_rows()}

    def forget_namespace(self, namespace: Namespace, wait_s: float | None = 0.0) -> dict[str, int]:
        """Forget a namespace for good under its write lease: its memory and ledger rows, then their bytes (fragments
        rewritten, indexes rebuilt, old versions dropped with no grace period: :mod:`~dualmem.stores.purge`), then
        its lease row; return ``{"items": n, "ledger": n}``."""
        with self.exclusive(namespace, wait_s=wait_s):
            gone = erase.forget_namespace(erase.folder_of(self._db, self.uri), namespace)
        erase.release_names(erase.folder_of(self._db, self.uri), [tuple(namespace)])
        return gone

    def forget_item(self, namespace: Namespace, item_id: str, wait_s: float | None = 0.0) -> dict[str, int]:
        """Forget one item for good under the namespace's write lease: its row, its version rows, its text in the
        ledger's plans, and their bytes; return ``{"items": rows gone, "ledger": plans scrubbed}``."""
        with self.exclusive(namespace, wait_s=wait_s):
            return erase.forget_item(erase.folder_of(self._db, self.uri), namespace, item_id)

    def tidy(self) -> None:
        """Compact the memory, ledger and lease tables, fold new rows into their indexes and drop versions older
        than ``tidy_keep``: what keeps files and versions bounded as memory grows. The write that makes a memory
        table version divisible by ``tidy_every`` calls it — whichever process or store object that is, so many
        short-lived writers tidy as one long one does; readers in flight keep the versions they read (younger than
        ``tidy_keep``, and the latest is never dropped)."""
        for table in (self.table, self.ledger.table, *self.leases.tables):
            L.optimize(table, keep_versions_for=self.tidy_keep)

    def _apply(self, ops: Sequence[MemoryOp]) -> builtins.list[Any]:
        committed: builtins.list[int] = []  # the memory table versions these operations made
        done = [self._one(op, committed) for op in ops]
        if self.tidy_every and any(v % self.tidy_every == 0 for v in committed):
            self.tidy()
        return done

    def _one(self, op: MemoryOp, committed: builtins.list[int]) -> Any:
        t = self.table
        if isinstance(op, GetItems):
            rows = one_per_key(L.scan(t, sql_in("pk", [row_key(op.namespace, i) for i in op.ids]), ITEM_COLUMNS))
            found = {r["id"]: r for r in rows.to_pylist()}
            return [row_to_item(found[i]) for i in op.ids if i in found]
        if isinstance(op, ScanItems):
            return self._scan(op)
        if isinstance(op, CountItems):
            return pc.count_distinct(L.scan(t, _where(op.namespace, op.kind, op.status), ["pk"]).column("pk")).as_py()
        if isinstance(op, SearchItems):
            return self._search(op)
        if isinstance(op, PutItems):
            data = pa.Table.from_pylist(put_rows(op, self.dims, self._now()), schema=self._schema)
            merge = t.merge_insert("pk").when_matched_update_all().when_not_matched_insert_all()
            committed.append(L.retry(lambda: merge.execute(data)).version)
            return None
        if isinstance(op, SetStatus):
            where = sql_in("pk", [row_key(op.namespace, i) for i in op.ids])
            values = {"status": op.status, "updated_at": self._now()}
            committed.append(L.retry(lambda: t.update(where=where, values=values)).version)
            return None
        if isinstance(op, DeleteItems):
            only = None if op.ids is None else sql_in("pk", [row_key(op.namespace, i) for i in op.ids])
            where = and_all(ns_eq_sql(op.namespace), only) or ""
            deleted = L.retry(lambda: t.delete(where))
            committed.append(deleted.version)
            return int(deleted.num_deleted_rows)
        if isinstance(op, ListNamespaces):
            under = and_all(ns_prefix_sql(op.prefix), None if op.kind is None else f"kind = {sql_str(op.kind)}")
            return [ns_parse(k) for k in L.scan(t, under, ["namespace"]).column("namespace").unique().to_pylist()]
        raise ValueError(f"unknown store operation {type(op).__name__}")

    # ------------------------------------------------------------------ helpers

    def _now(self) -> Any:
        """Return the write time: now, but after this object's previous write (updated_at orders its writes)."""
        now = utcnow()
        self._last = now if now > self._last else self._last + timedelta(microseconds=1)
        return self._last

    def _scan(self, op: ScanItems) -> pa.Table:
        """A namespace's rows (see :class:`ScanItems`). Rows given by address (``at``) are read there: a few ms,
        where a search by key is a query over the whole table; only those no longer current there are searched."""
        names = {"stamps": STAMP_COLUMNS, "items": ITEM_COLUMNS, "vectors": [*ITEM_COLUMNS, "vector"]}[op.columns]
        stamps, where = op.columns == "stamps", _where(op.namespace, op.kind, op.status)
        if op.ids is None:
            rows = L.scan(self.table, where, names, rowid=stamps)
        else:
            keys, parts = [row_key(op.namespace, i) for i in op.ids], []
            at = [] if stamps else [a for a in op.at or () if a is not None]
            if at:  # the rows the stamps scan saw, where still current; kept if they are what was asked
                taken = L.take(self.table, at, names)
                parts.append(taken.filter(_matching(taken, keys, op.kind, op.status)))
            rest = sorted(set(keys) - set(parts[0].column("pk").to_pylist())) if parts else keys
            if rest or not parts:  # by key: what was not found at an address (or every id, with none given)
                parts.append(L.scan(self.table, and_all(where, sql_in("pk", rest)), names, rowid=stamps))
            rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if stamps:
            rows = rows.rename_columns([*names, "row"])
        return one_per_key(rows).sort_by("pk")

    def _search(self, op: SearchItems) -> builtins.list[ScoredItem]:
        """Read the namespace's rows of the kind and status (one SQL scan, vectors only when cosine ranks) and rank
        them with the one ranker (:mod:`~dualmem.stores.ranking`)."""
        columns = ITEM_COLUMNS if op.mode == "fts" else [*ITEM_COLUMNS, "vector"]
        rows = one_per_key(L.scan(self.table, _where(op.namespace, op.kind, op.status), columns))
        mask = ranking.allowed(rows, op.filter, op.since, op.until)
        vectors = None if op.mode == "fts" else vectors_of(rows, self.dims)
        corpus = ranking.Corpus(
            rows.column("pk").to_numpy(zero_copy_only=False), vectors, rows.column("text").to_pylist()
        )
        found = ranking.search(corpus, op.query, op.vector, op.k, op.mode, mask)
        picked = rows.select(ITEM_COLUMNS).take(pa.array([n for n, _ in found], pa.int64())).to_pylist()
        return [ScoredItem(row_to_item(r), score) for r, (_, score) in zip(picked, found, strict=True)]


def _where(namespace: Namespace, kind: str | None, status: str | None) -> str:
    return (
        and_all(
            ns_eq_sql(namespace),
            None if kind is None else f"kind = {sql_str(kind)}",
            None if status is None else f"status = {sql_str(status)}",
        )
        or ""
    )


def _matching(rows: pa.Table, keys: list[str], kind: str | None, status: str | None) -> pa.Array:
    """Which ``rows`` have one of these keys, and ``kind`` and ``status`` where given."""
    keep = pc.is_in(rows.column("pk"), pa.array(keys, pa.string()))
    if kind is not None:
        keep = pc.and_(keep, pc.equal(rows.column("kind"), kind))
    if status is not None:
        keep = pc.and_(keep, pc.equal(rows.column("status"), status))
    return keep


def stored_namespaces(
    uri: str, storage_options: Mapping[str, str] | str | None = None, prefix: Namespace = ()
) -> list[Namespace] | None:
    """Return the namespaces holding items in the store at ``uri`` (None: there is no store there), without loading an
    embedder or creating anything: what a command checks before any slow work."""
    if "://" not in str(uri) and not Path(str(uri)).expanduser().is_dir():
        return None
    db = L.connect(str(uri), L.storage_options(storage_options), create=False)
    names = L.table_names(db)
    if TABLE not in names and not any(n in names for n in LEGACY_TABLES):
        return None
    tables = [db.open_table(TABLE)] if TABLE in names else [db.open_table(n) for n in LEGACY_TABLES if n in names]
    keys = {
        k
        for t in tables
        for k in L.scan(t, ns_prefix_sql(prefix), ["namespace"]).column("namespace").unique().to_pylist()
    }
    return sorted(ns_parse(k) for k in keys)


def _vector_size(schema: pa.Schema) -> int | None:
    """Return the vector size a memory table's schema holds."""
    return getattr(schema.field("vector").type, "list_size", None)


def _loaded(embeddings: Any) -> Any:
    """Return ``embeddings`` loaded when it is a spec string."""
    if not isinstance(embeddings, str):
        return embeddings
    from dualmem.models import load_embeddings

    return load_embeddings(embeddings)


def _dims(embeddings: Any) -> int:
    from dualmem.models import embedding_dims

    return embedding_dims(embeddings)


def _namespace_keys(table: Any) -> list[str]:
    return sorted(L.scan(table, None, ["namespace"]).column("namespace").unique().to_pylist())


def gather(table: Any, ns_key: str, min_rows: int = 64) -> int:
    """Rewrite a namespace's rows into one fragment when they lie in several; return 1 if it did, else 0.

    One keyed update of the rows by themselves, conditional on each row being unchanged since it was read
    (``updated_at``): a row written or deleted meanwhile by another process is left as that process left it,
    and readers see the namespace whole before and after (one commit; no row's content or stamp changes).
    """
    where = f"namespace = {sql_str(ns_key)}"
    ids = table.search().where(where).select(["pk"]).with_row_id(True).limit(None).to_arrow()
    if ids.num_rows < min_rows or len({r >> 32 for r in ids.column("_rowid").to_pylist()}) <= 1:
        return 0
    rows = L.scan(table, where, list(table.schema.names))
    update = table.merge_insert("pk").when_matched_update_all(where="target.updated_at = source.updated_at")
    L.retry(lambda: update.execute(rows))
    return 1


def recorded_embedder(db: Any) -> Any:
    """Return the embedder the store's memory table records (created with), for openers that name none.

    A store made before the embedder was recorded is opened with the default (bundled) embedder
    when its vectors have that size; otherwise the caller must name the embedder.
    """
    from dualmem.config import setting_default
    from dualmem.models import BUNDLED_DIMS, load_embeddings

    table = db.open_table(TABLE)
    spec = (table.schema.metadata or {}).get(EMBEDDER_KEY.encode(), b"").decode()
    dims = getattr(table.schema.field("vector").type, "list_size", None)
    if not spec and dims == BUNDLED_DIMS:
        spec = setting_default("embedder")
    if not spec:
        raise ConfigurationError(
            f"the store at {table.name!r} does not record its {dims}-dim embedder; open it with "
            "LanceDBStore(uri, embeddings=...) or LanceDBStore.from_settings() naming the embedder it was written with"
        )
    return load_embeddings(spec)
