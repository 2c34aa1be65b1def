"""LanceDB dual store: a facts table and an insights table (contract of DESIGN.md).

Every other view of the store (LangGraph ``BaseStore``, LangChain retriever, agent tools) is a thin shell over this class.

Layout at ``uri``: tables ``facts`` and ``insights`` (one row per ``MemoryItem``;
namespace as its JSON array string, vectors unit-normalised in float16, ``meta``
as JSON), ``chunk_ledger`` (units of work a writer drafted or applied,
:mod:`~dualmem.stores.ledger`) and ``write_leases`` (:mod:`~dualmem.stores.leases`).
A row's key is ``pk`` = namespace + id, so an id is unique per namespace and every
read, write and delete names its namespace: nothing can reach another namespace's items.

Shared use: every read sees every commit finished before it began, from any
process (connections check the latest table version on each read). Writers of
one namespace take turns through its write lease; the writer and the
baselines apply each unit of work once through the ledger.

Indexes: BTREE on ``pk``, ``id`` and ``event_time``, BITMAP on ``namespace``
and ``status``, native full-text on ``text``, and an IVF vector index built by
``optimize()`` (``dualmem maintain``) once a table holds ``vector_index_min_rows``
rows, never inside a write (at a million rows it takes minutes). Rows written after an index was built are
still searched; ``optimize()`` folds them in (and runs by itself before a full-text search once enough accumulate). Hybrid search fuses the
vector and full-text rankings by reciprocal rank (``1 / (60 + rank)``).
``event_time`` is an ISO-8601 string, so ``since``/``until`` compare it as text.

A namespace of up to ``flat_search_max_rows`` active items is held in RAM
(``_vcache``), checked against the table version on every read: vector search is
exact there, and ``list``/``count``/``get`` of active items read it once it is held;
larger namespaces use LanceDB's prefiltered search (through the IVF index once built).
"""
from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import pyarrow as pa
from langchain_core.embeddings import Embeddings

import dualmem.stores._lance as L
import dualmem.stores._vcache as _vcache
from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.schema import MemoryItem, MemoryKind, utcnow
from dualmem.stores._rows import ITEM_COLUMNS, PK_SQL, item_schema, item_to_row, row_to_item
from dualmem.stores._search import Snapshot, TableSearch, sorted_page
from dualmem.stores._sql import (
    Scope,
    and_all,
    filter_sql,
    ns_eq_sql,
    ns_key,
    ns_parse,
    ns_prefix_sql,
    row_key,
    sql_in,
    status_sql,
)
from dualmem.stores.leases import Lease, Leases
from dualmem.stores.ledger import Ledger
from dualmem.stores.results import DualResult, ScoredItem

SearchMode = Literal["hybrid", "vector", "fts"]
Namespace = tuple[str, ...]
TABLES: dict[str, str] = {"fact": "facts", "insight": "insights"}
INDEXES = {"pk": "BTREE", "id": "BTREE", "namespace": "BITMAP", "status": "BITMAP", "event_time": "BTREE", "text": "FTS"}
# fields a structured ``filter`` may name (public key -> column)
FILTERABLE = {"id": "id", "session_id": "session_id", "chunk_id": "chunk_id", "event_time": "event_time", "status": "status"}


class DualStore:
    """Facts and insights in two LanceDB tables with vector, full-text and hybrid search.

    API (every method names the namespace it touches):

    - ``DualStore(uri, embeddings)`` / ``DualStore.from_settings(settings, embeddings=None)``
    - ``upsert(items, vectors=None)`` — idempotent by (namespace, id); embeds ``text``
      (or takes ``vectors``); keeps ``created_at`` of an existing row, sets ``updated_at``
    - ``get(namespace, ids)``, ``list(namespace, kind=None, status="active", limit=None, newest_first=True)``,
      ``count(namespace, kind=None, status="active")``, ``namespaces(prefix=())``
    - ``search(namespace, query, kind=None, k=10, mode="hybrid", status="active", filter=None,
      since=None, until=None, vector=None)``; ``filter`` is a dict over ``FILTERABLE`` fields
      (``{"session_id": "s1"}``, ``{"event_time": {"$gte": "2024"}}``, ``{"chunk_id": {"$in": [...]}}``)
    - ``search_vectors(namespace, vector, k=10, kind="fact", filter=None)`` -> ``[(id, cosine)]``
    - ``snapshot(namespace, kind, filter=None)`` -> the namespace's rows and unit vectors held in RAM (rankers)
    - ``dual_search(namespace, query, k_facts=10, k_insights=10, mode="hybrid", merged=False, expand=True)``
    - ``supersede(namespace, ids)``, ``delete(namespace, ids)``, ``drop_namespace(namespace)``, ``optimize()``
    - exactly-once writing: ``exclusive(namespace)`` (the namespace's write lease, a context
      manager) and ``ledger`` (pending/applied units of work); ``chunk_applied(namespace, chunk_id)``
    - ``pinned()``: a block of reads that looks up each table's latest version once
    """

    def __init__(
        self, uri: str, embeddings: Embeddings, *, dims: int | None = None, storage_options: Mapping[str, str] | str | None = None,
        lease_ttl_s: float | None = None, lease_wait_s: float | None = None, lease_linger_s: float | None = None,
        vector_index_min_rows: int = 100_000, flat_search_max_rows: int = 50_000, fts_reindex_rows: int = 5_000, cache_rows: int = 500_000,
    ) -> None:  # fmt: skip
        if embeddings is None:
            raise ConfigurationError("DualStore needs an embeddings object; use DualStore.from_settings(settings)")
        defaults = Settings() if None in (lease_ttl_s, lease_wait_s, lease_linger_s, storage_options) else None
        self.uri = str(uri)
        self.embeddings = embeddings
        self.dims = dims or _dims_of(embeddings)
        self.vector_index_min_rows, self.flat_search_max_rows, self.fts_reindex_rows = vector_index_min_rows, flat_search_max_rows, fts_reindex_rows
        options = L.storage_options(storage_options if storage_options is not None else defaults.store_options)  # type: ignore[union-attr]
        self._db = L.connect(self.uri, options)
        self._cache = _vcache.VectorCache(cache_rows)
        self._maintain = L.AutoOptimize()
        schema = item_schema(self.dims)
        self._tables = {kind: L.open_or_create(self._db, name, schema) for kind, name in TABLES.items()}
        for table in self._tables.values():
            L.check_dims(table, "vector", self.dims, self.uri)
            L.migrate_columns(table, schema, PK_SQL)
            L.ensure_indexes(table, L.base_index_configs(INDEXES))
        self._schemas = {kind: table.schema for kind, table in self._tables.items()}  # read once (a round trip each)
        self._searchers = {
            kind: TableSearch(kind, table, self._cache, self.dims, flat_search_max_rows, fts_reindex_rows)
            for kind, table in self._tables.items()
        }
        self.ledger = Ledger(self._db)
        self.leases = Leases(
            self._db,
            ttl_s=lease_ttl_s if lease_ttl_s is not None else defaults.lease_ttl_s,  # type: ignore[union-attr]
            wait_s=lease_wait_s if lease_wait_s is not None else defaults.lease_wait_s,  # type: ignore[union-attr]
            linger_s=lease_linger_s if lease_linger_s is not None else defaults.lease_linger_s,  # type: ignore[union-attr]
        )

    @classmethod
    def from_settings(cls, settings: Settings | None = None, embeddings: Embeddings | None = None) -> DualStore:
        """Open the store at ``settings.store_uri`` with the settings' embedder."""
        from dualmem.models import load_embeddings

        s = Settings.resolve(settings)
        return cls(
            s.store_uri, load_embeddings(embeddings, s), storage_options=s.store_options,
            lease_ttl_s=s.lease_ttl_s, lease_wait_s=s.lease_wait_s, lease_linger_s=s.lease_linger_s,
        )  # fmt: skip

    # ------------------------------------------------------------------ exactly once

    @contextmanager
    def exclusive(
        self, namespace: Namespace, owner: str | None = None, wait_s: float | None = None, give_up: Callable[[], bool] | None = None
    ) -> Iterator[Lease | None]:
        """Hold the namespace's write lease for the block (one writer per namespace, any process).

        With ``give_up``, waiting ends when it answers True and the block gets None (no lease).
        """
        with self.leases.hold(tuple(namespace), owner, wait_s, give_up) as lease:
            yield lease

    def chunk_applied(self, namespace: Namespace, chunk_id: str) -> bool:
        """Return True if the unit of work ``chunk_id`` was applied to ``namespace``."""
        return self.ledger.applied(namespace, chunk_id)

    # ------------------------------------------------------------------ writes

    def _commit(self, kind: str, ns: str, write: Any, drop: set[str], rows: builtins.list[dict[str, Any]]) -> None:
        """Run one write on ``kind``'s table and let this store's RAM views follow it."""
        table = self._tables[kind]
        before = table.version
        result = L.retry(write)
        after = int(getattr(result, "version", 0) or 0)
        self._cache.committed(kind, before, after, ns, drop, rows)
        self._maintain.committed(table)

    def upsert(self, items: Sequence[MemoryItem], vectors: Sequence[Sequence[float]] | None = None, *, as_given: bool = False) -> None:
        """Insert or replace items by (namespace, id).

        By default an existing row keeps its ``created_at`` (and its vector when the text is
        unchanged), and an id that changed kind leaves the other table. ``as_given`` (needs
        ``vectors``) writes the items exactly as given, without reading the rows first — for
        writers whose items carry their own ``created_at`` and never change kind.
        """
        if vectors is not None and len(vectors) != len(items):
            raise ValueError(f"upsert got {len(items)} items but {len(vectors)} vectors; pass one vector per item")
        if as_given and vectors is None:
            raise ValueError("upsert(as_given=True) needs the items' vectors")
        latest: dict[str, tuple[MemoryItem, Sequence[float] | None]] = {}
        for i, item in enumerate(items):
            latest[row_key(item.namespace, item.id)] = (item, None if vectors is None else vectors[i])
        now = utcnow()
        for kind, table in self._tables.items():
            group = {pk: pair for pk, pair in latest.items() if pair[0].kind == kind}
            if not group:
                continue
            columns = ["pk", "text", "created_at"] if vectors is not None else ["pk", "text", "created_at", "vector"]
            old = {} if as_given else {r["pk"]: r for r in L.query_rows(table, sql_in("pk", group), columns)}
            need = [it.text for pk, (it, vec) in group.items() if vec is None and (pk not in old or old[pk]["text"] != it.text)]
            fresh = iter(self.embeddings.embed_documents(need) if need else [])
            rows = []
            for pk, (it, vec) in group.items():
                if vec is None:
                    prev = old.get(pk)
                    vec = prev["vector"] if prev is not None and prev["text"] == it.text else next(fresh)
                created = old[pk]["created_at"] if pk in old else it.created_at
                rows.append(item_to_row(it, vec, created_at=created, updated_at=now, dims=self.dims))
            for nskey in {r["namespace"] for r in rows}:
                mine = [r for r in rows if r["namespace"] == nskey]
                data = pa.Table.from_pylist(mine, schema=self._schemas[kind])
                merge = table.merge_insert("pk").when_matched_update_all().when_not_matched_insert_all()
                self._commit(kind, nskey, lambda m=merge, d=data: m.execute(d), {r["id"] for r in mine}, mine)
                other = "insight" if kind == "fact" else "fact"
                moved = sql_in("pk", [r["pk"] for r in mine])
                if not as_given and self._tables[other].count_rows(moved):  # an id that changed kind leaves the other table
                    self._commit(other, nskey, lambda o=other, w=moved: self._tables[o].delete(w), {r["id"] for r in mine}, [])

    def supersede(self, namespace: Namespace, ids: Sequence[str], kind: MemoryKind | None = None) -> None:
        """Mark items of ``namespace`` (of ``kind``, when known) superseded (kept for history, hidden from search)."""
        if not ids:
            return
        where = sql_in("pk", [row_key(namespace, i) for i in ids])
        for kd in self._kinds(kind) if kind else list(self._tables):
            values = {"status": "superseded", "updated_at": utcnow()}
            table = self._tables[kd]
            self._commit(kd, ns_key(namespace), lambda t=table, v=values: t.update(where=where, values=v), set(ids), [])

    def delete(self, namespace: Namespace, ids: Sequence[str]) -> None:
        """Delete items of ``namespace`` for good."""
        if not ids:
            return
        where = sql_in("pk", [row_key(namespace, i) for i in ids])
        for kind, table in self._tables.items():
            self._commit(kind, ns_key(namespace), lambda t=table: t.delete(where), set(ids), [])

    def drop_namespace(self, namespace: Namespace) -> None:
        """Delete every item and ledger row of a namespace."""
        where = ns_eq_sql(namespace)
        for kind, table in self._tables.items():
            ids = {r["id"] for r in L.query_rows(table, where, ["id"])}
            self._commit(kind, ns_key(namespace), lambda t=table: t.delete(where), ids, [])
        self.ledger.drop(namespace)

    def optimize(self, cluster: bool = True) -> dict[str, int]:
        """Maintain the tables: gather each scattered namespace's rows together (``cluster``), compact,
        fold new rows into the indexes, build the vector index once a table is large enough, drop old versions.

        Returns how many namespaces were gathered per kind. A namespace is gathered under its
        write lease, so it never races a writer of that namespace; readers see it before or after.
        """
        from datetime import timedelta

        from dualmem.stores._cluster import gather_scattered

        gathered = {}
        for kind, table in self._tables.items():
            gathered[kind] = gather_scattered(self, table) if cluster else 0
            rows = table.count_rows()
            if rows >= self.vector_index_min_rows and not L.has_index(table, "vector"):
                L.build_vector_index(table, rows)
            L.optimize(table, keep_versions_for=timedelta(minutes=10))
        return gathered

    # ------------------------------------------------------------------ reads

    def get(self, namespace: Namespace, ids: Sequence[str]) -> builtins.list[MemoryItem]:
        """Return the items of ``namespace`` with these ids (missing ids skipped, order kept)."""
        if isinstance(ids, str):
            raise TypeError("get(namespace, ids) takes a list of ids")
        if not ids:
            return []
        found: dict[str, MemoryItem] = {}
        for searcher in self._searchers.values():  # an id lives in one table: the next one is asked only for the rest
            rows = searcher.rows_by_id(tuple(namespace), [i for i in dict.fromkeys(ids) if i not in found])
            found.update((i, row_to_item(r)) for i, r in rows.items())
        return [found[i] for i in ids if i in found]

    def list(
        self,
        namespace: Namespace,
        kind: MemoryKind | None = None,
        status: str | None = "active",
        limit: int | None = None,
        newest_first: bool = True,
    ) -> builtins.list[MemoryItem]:
        """List a namespace's items."""
        views = self._held(namespace, kind) if status == "active" else None
        if views is not None:  # the namespace's active rows are in RAM (checked fresh): sort there, parse only the page
            return [row_to_item(r) for r in sorted_page(views, limit, newest_first)]
        where = and_all(ns_eq_sql(namespace), status_sql(status))
        rows = [r for table in self._pick(kind) for r in L.query_rows(table, where, ITEM_COLUMNS)]
        rows.sort(key=lambda r: (r["created_at"], r["updated_at"], r["id"]), reverse=newest_first)
        return [row_to_item(r) for r in (rows if limit is None else rows[:limit])]

    def count(self, namespace: Namespace, kind: MemoryKind | None = None, status: str | None = "active") -> int:
        """Count a namespace's items."""
        views = self._held(namespace, kind) if status == "active" else None
        if views is not None:
            return sum(v.num_rows for v in views)
        where = and_all(ns_eq_sql(namespace), status_sql(status))
        return sum(table.count_rows(where) for table in self._pick(kind))

    def _held(self, namespace: Namespace, kind: MemoryKind | None) -> builtins.list[pa.Table] | None:
        """Return the active rows of each ``kind`` table from the RAM views this store holds (None: one is not held)."""
        entries = [self._searchers[k].held(Scope(tuple(namespace), "active")) for k in (self._kinds(kind) if kind else self._tables)]
        return None if any(e is None or e.rows is None for e in entries) else [e.rows for e in entries]  # type: ignore[union-attr]

    def namespaces(self, prefix: Namespace = (), kind: MemoryKind | None = None) -> builtins.list[Namespace]:
        """List the namespaces holding items (of ``kind``), at or below ``prefix``."""
        keys: set[str] = set()
        where = ns_prefix_sql(prefix)
        for table in self._pick(kind):
            keys.update(L.scan(table, where, ["namespace"]).column("namespace").unique().to_pylist())
        return sorted(ns_parse(k) for k in keys)

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Let this thread's reads in the block look up each table's latest version once (``TableSearch.pinned``)."""
        with self._searchers["fact"].pinned(), self._searchers["insight"].pinned():
            yield

    def search(
        self,
        namespace: Namespace,
        query: str,
        kind: MemoryKind | None = None,
        k: int = 10,
        mode: SearchMode = "hybrid",
        status: str | None = "active",
        filter: Mapping[str, Any] | None = None,  # noqa: A002 - the LangGraph store's name for it
        since: str | None = None,
        until: str | None = None,
        vector: Sequence[float] | None = None,
    ) -> builtins.list[ScoredItem]:
        """Search one namespace."""
        if mode not in ("hybrid", "vector", "fts"):
            raise ConfigurationError(f"search mode {mode!r} is not one of hybrid, vector, fts")
        scope = Scope(tuple(namespace), status, filter_sql(filter, FILTERABLE), since, until)
        if mode != "fts" and vector is None:
            vector = self.embeddings.embed_query(query)
        hits: builtins.list[ScoredItem] = []
        for kd in ["fact", "insight"] if kind is None else self._kinds(kind):
            rows = self._searchers[kd].rows(query, vector, k, mode, scope)
            hits.extend(ScoredItem(row_to_item(r), s) for r, s in rows)
        hits.sort(key=lambda h: -h.score)
        return hits[:k]

    def search_vectors(
        self,
        namespace: Namespace,
        vector: Sequence[float],
        k: int = 10,
        kind: MemoryKind = "fact",
        filter: Mapping[str, Any] | None = None,  # noqa: A002
    ) -> builtins.list[tuple[str, float]]:
        """Return ``(id, cosine score)`` of the ``k`` nearest active items, without parsing items."""
        scope = Scope(tuple(namespace), "active", filter_sql(filter, FILTERABLE))
        rows = self._searchers[self._kinds(kind)[0]].vector_rows(vector, k, scope, ["id"])
        return [(r["id"], 1.0 - r["_distance"]) for r in rows]

    def snapshot(self, namespace: Namespace, kind: MemoryKind, filter: Mapping[str, Any] | None = None,  # noqa: A002
                 since: str | None = None, until: str | None = None) -> Snapshot | None:
        """Return the namespace's active ``kind`` items and unit vectors at the table's latest version (what rankers
        compute features from); None when it holds over ``flat_search_max_rows`` items."""
        scope = Scope(tuple(namespace), "active", filter_sql(filter, FILTERABLE), since, until)
        return self._searchers[self._kinds(kind)[0]].snapshot(scope)

    def dual_search(self, namespace: Namespace, query: str, k_facts: int = 10, k_insights: int = 10, mode: SearchMode = "hybrid",
                    merged: bool = False, expand: bool = True) -> DualResult:
        """Search facts and insights; expand insights with their cited facts (same namespace)."""
        vector = None if mode == "fts" else self.embeddings.embed_query(query)
        if merged:
            pool = self.search(namespace, query, k=max(k_facts, k_insights), mode=mode, vector=vector)
            result = DualResult(merged=pool)
            result.facts = [h for h in pool if h.item.kind == "fact"]
            result.insights = [h for h in pool if h.item.kind == "insight"]
        else:
            facts = self.search(namespace, query, kind="fact", k=k_facts, mode=mode, vector=vector)
            insights = self.search(namespace, query, kind="insight", k=k_insights, mode=mode, vector=vector)
            result = DualResult(facts=facts, insights=insights)
        if expand and result.insights:
            result.grounding = self.grounding(namespace, [h.item for h in result.insights])
        return result

    def grounding(self, namespace: Namespace, insights: Sequence[MemoryItem]) -> dict[str, builtins.list[MemoryItem]]:
        """Return, per insight id, the facts of ``namespace`` it cites (missing ones skipped)."""
        cited = builtins.list(dict.fromkeys(f for i in insights for f in i.grounding))
        rows = self._searchers["fact"].rows_by_id(tuple(namespace), cited, load=True) if cited else {}
        by_id = {i: row_to_item(r) for i, r in rows.items()}
        return {i.id: [by_id[f] for f in i.grounding if f in by_id] for i in insights}

    # ------------------------------------------------------------------ internals

    def _kinds(self, kind: str) -> builtins.list[str]:
        if kind not in self._tables:
            raise ConfigurationError(f"memory kind {kind!r} is not one of fact, insight")
        return [kind]

    def _pick(self, kind: MemoryKind | None) -> builtins.list[Any]:
        return builtins.list(self._tables.values()) if kind is None else [self._tables[k] for k in self._kinds(kind)]


def _dims_of(embeddings: Embeddings) -> int:
    from dualmem.models import embedding_dims

    return embedding_dims(embeddings)
