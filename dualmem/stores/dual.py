"""LanceDB dual store: a facts table and an insights table (contract of DESIGN.md).

Every other view of the store (LangGraph ``BaseStore``, LangChain retriever,
agent tools) is a thin shell over this class.

Layout at ``uri``: tables ``facts`` and ``insights`` (one row per
``MemoryItem``; namespace stored as its JSON array string, vectors as
fixed-size float32 lists, ``meta`` as JSON) and ``chunk_ledger`` (chunks a
writer already applied). Indexes: BTREE on ``id`` and ``event_time``, BITMAP on
``namespace`` and ``status``, native full-text on ``text``, and an IVF vector index once a table
holds ``vector_index_min_rows`` rows. Rows written after an index was built are
still searched (LanceDB scans unindexed rows); ``optimize()`` folds them into
the indexes and runs by itself before a full-text search once enough accumulate.
Hybrid search fuses the vector and full-text rankings with reciprocal-rank
fusion (``1 / (60 + rank)``). ``event_time`` is an ISO-8601 string, so
``since``/``until`` compare it as text.

Vector search in a namespace of up to ``flat_search_max_rows`` active items is
exact and runs in RAM: the namespace's rows and normalised vectors are loaded
once (``_vcache``) and searched with one matrix product, because LanceDB
re-reads and decodes vectors on every prefiltered scan. Every write through a
store of this process invalidates what it touched; table handles are shared per
process so all stores see each other's writes. Larger namespaces use LanceDB's
prefiltered search (through the IVF index once built).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from langchain_core.embeddings import Embeddings

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.schema import MemoryItem, MemoryKind, stable_id, utcnow
from dualmem.stores import _lance as L
from dualmem.stores import _vcache
from dualmem.stores._rows import (
    ITEM_COLUMNS,
    LEDGER_SCHEMA,
    item_schema,
    item_to_row,
    row_to_item,
)

SearchMode = Literal["hybrid", "vector", "fts"]
Namespace = tuple[str, ...]
TABLES: dict[str, str] = {"fact": "facts", "insight": "insights"}
LEDGER = "chunk_ledger"
RRF_K = 60


@dataclass
class ScoredItem:
    """A memory item with its search score (higher is better)."""

    item: MemoryItem
    score: float


@dataclass
class DualResult:
    """Facts and insights for one query; each insight expanded with the facts it cites."""

    facts: list[ScoredItem] = field(default_factory=list)
    insights: list[ScoredItem] = field(default_factory=list)
    grounding: dict[str, list[MemoryItem]] = field(default_factory=dict)
    merged: list[ScoredItem] = field(default_factory=list)


class DualStore:
    """Facts and insights in two LanceDB tables with vector, full-text and hybrid search.

    API (stable; the writer, responder and frameworks depend on it):

    - ``DualStore(uri, embeddings)`` / ``DualStore.from_settings(settings, embeddings=None)``
    - ``upsert(items)`` — idempotent by ``id``; embeds ``text``; keeps ``created_at``
      of an existing row, sets ``updated_at``
    - ``get(ids) -> list[MemoryItem]`` (missing ids skipped, order of ``ids`` kept)
    - ``list(namespace, kind=None, status="active", limit=None, newest_first=True)``
    - ``search(namespace, query, kind=None, k=10, mode="hybrid", status="active",
      where=None, since=None, until=None) -> list[ScoredItem]`` — ``where`` is an
      extra SQL filter; ``since``/``until`` filter ``event_time``
    - ``dual_search(namespace, query, k_facts=10, k_insights=10, mode="hybrid",
      merged=False, expand=True) -> DualResult``
    - ``supersede(ids)`` (status -> superseded) and ``delete(ids)`` (hard delete)
    - ``count(namespace, kind=None, status="active") -> int``
    - ``namespaces(prefix=()) -> list[Namespace]``
    - ``drop_namespace(namespace)``
    - chunk ledger for idempotent writers: ``chunk_applied(namespace, chunk_id) -> bool``,
      ``mark_chunk_applied(namespace, chunk_id, payload: str)``

    Additions (backward compatible): ``upsert(items, vectors=None)`` takes
    precomputed vectors; ``search(..., vector=None)`` a precomputed query vector;
    ``search_vectors(namespace, vector, k, kind, where)`` returns ``(id, score)``
    only; ``optimize()`` folds new rows into the indexes (and builds the vector
    index); ``ledger_payload(namespace, chunk_id)``; tuning keywords of
    ``__init__``: ``dims``, ``vector_index_min_rows``, ``flat_search_max_rows``,
    ``fts_reindex_rows``, ``cache_rows``.
    """

    def __init__(
        self,
        uri: str,
        embeddings: Embeddings,
        *,
        dims: int | None = None,
        vector_index_min_rows: int = 100_000,
        flat_search_max_rows: int = 50_000,
        fts_reindex_rows: int = 5_000,
        cache_rows: int = 500_000,
    ) -> None:
        if embeddings is None:
            raise ConfigurationError("DualStore needs an embeddings object; use DualStore.from_settings(settings)")
        self.uri = str(uri)
        self.embeddings = embeddings
        self.dims = dims or _dims_of(embeddings)
        self.vector_index_min_rows = vector_index_min_rows
        self.flat_search_max_rows = flat_search_max_rows
        self.fts_reindex_rows = fts_reindex_rows
        self._db = L.connect(self.uri)
        self._cache = _vcache.VectorCache(cache_rows)
        schema = item_schema(self.dims)
        self._tables = {kind: L.open_or_create(self._db, name, schema) for kind, name in TABLES.items()}
        for table in self._tables.values():
            L.check_dims(table, "vector", self.dims, self.uri)
            L.ensure_base_indexes(table)
        self._ledger = L.open_or_create(self._db, LEDGER, LEDGER_SCHEMA)
        self._dirty = {kind: True for kind in TABLES}
        self._vector_indexed = {kind: L.has_index(t, "vector") for kind, t in self._tables.items()}

    @classmethod
    def from_settings(cls, settings: Settings | None = None, embeddings: Embeddings | None = None) -> DualStore:
        """Open the store at ``settings.store_uri`` with the settings' embedder."""
        from dualmem.models import load_embeddings

        settings = Settings.resolve(settings)
        return cls(settings.store_uri, load_embeddings(embeddings, settings))

    # ------------------------------------------------------------------ writes

    def upsert(self, items: Sequence[MemoryItem], vectors: Sequence[Sequence[float]] | None = None) -> None:
        """Insert or replace items by id."""
        if vectors is not None and len(vectors) != len(items):
            raise ValueError(f"upsert got {len(items)} items but {len(vectors)} vectors; pass one vector per item")
        latest: dict[str, tuple[MemoryItem, Sequence[float] | None]] = {}
        for i, item in enumerate(items):
            latest[item.id] = (item, None if vectors is None else vectors[i])
        now = utcnow()
        for kind, table in self._tables.items():
            group = [(it, vec) for it, vec in latest.values() if it.kind == kind]
            if not group:
                continue
            ids = [it.id for it, _ in group]
            old = {r["id"]: r for r in L.query_rows(table, L.sql_in("id", ids), ["id", "text", "created_at", "vector"])}
            need = [it.text for it, vec in group if vec is None and (it.id not in old or old[it.id]["text"] != it.text)]
            fresh = iter(self.embeddings.embed_documents(need) if need else [])
            rows = []
            for it, vec in group:
                if vec is None:
                    prev = old.get(it.id)
                    vec = prev["vector"] if prev is not None and prev["text"] == it.text else next(fresh)
                created = old[it.id]["created_at"] if it.id in old else it.created_at
                rows.append(item_to_row(it, vec, created_at=created, updated_at=now, dims=self.dims))
            self._merge(table, rows)
            self._dirty[kind] = True
            for nskey in {r["namespace"] for r in rows}:  # keep this store's RAM cache fresh, not reloaded
                mine = [r for r in rows if r["namespace"] == nskey]
                self._cache.patch(self.uri, kind, nskey, {r["id"] for r in mine}, mine)
            other_kind = "insight" if kind == "fact" else "fact"
            moved = L.sql_in("id", ids)
            if self._tables[other_kind].count_rows(moved):
                self._tables[other_kind].delete(moved)
                self._cache.patch(self.uri, other_kind, None, set(ids), [])
            if not self._vector_indexed[kind] and table.count_rows() >= self.vector_index_min_rows:
                L.build_vector_index(table, table.count_rows())
                self._vector_indexed[kind] = True

    def _merge(self, table: Any, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        data = pa.Table.from_pylist(rows, schema=table.schema)
        table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)

    def supersede(self, ids: Sequence[str]) -> None:
        """Mark items superseded (kept for history, hidden from search)."""
        if not ids:
            return
        for kind, table in self._tables.items():
            table.update(where=L.sql_in("id", ids), values={"status": "superseded", "updated_at": utcnow()})
            self._cache.patch(self.uri, kind, None, set(ids), [])

    def delete(self, ids: Sequence[str]) -> None:
        """Delete items for good."""
        if not ids:
            return
        for kind, table in self._tables.items():
            table.delete(L.sql_in("id", ids))
            self._cache.patch(self.uri, kind, None, set(ids), [])

    def drop_namespace(self, namespace: Namespace) -> None:
        """Delete every item and ledger row of a namespace."""
        where = L.ns_eq_sql(namespace)
        for table in (*self._tables.values(), self._ledger):
            table.delete(where)
        for kind in self._tables:
            _vcache.bump(self.uri, kind, L.ns_key(namespace))

    def optimize(self) -> None:
        """Fold new rows into the indexes, build the vector index once tables are large enough."""
        for kind, table in self._tables.items():
            rows = table.count_rows()
            if rows >= self.vector_index_min_rows and not L.has_index(table, "vector"):
                L.build_vector_index(table, rows)
            table.optimize()
            self._dirty[kind] = False
            self._vector_indexed[kind] = L.has_index(table, "vector")

    # ------------------------------------------------------------------ reads

    def get(self, ids: Sequence[str]) -> list[MemoryItem]:
        """Return the items with these ids."""
        if not ids:
            return []
        found: dict[str, MemoryItem] = {}
        for table in self._tables.values():
            for row in L.query_rows(table, L.sql_in("id", list(ids)), ITEM_COLUMNS):
                found[row["id"]] = row_to_item(row)
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
        where = L.and_all(L.ns_eq_sql(namespace), L.status_sql(status))
        rows = [r for table in self._pick(kind) for r in L.query_rows(table, where, ITEM_COLUMNS)]
        rows.sort(key=lambda r: (r["created_at"], r["updated_at"], r["id"]), reverse=newest_first)
        return [row_to_item(r) for r in (rows if limit is None else rows[:limit])]

    def count(self, namespace: Namespace, kind: MemoryKind | None = None, status: str | None = "active") -> int:
        """Count a namespace's items."""
        where = L.and_all(L.ns_eq_sql(namespace), L.status_sql(status))
        return sum(table.count_rows(where) for table in self._pick(kind))

    def namespaces(self, prefix: Namespace = ()) -> builtins.list[Namespace]:
        """List the namespaces holding items."""
        keys: set[str] = set()
        for table in self._tables.values():
            query = table.search()
            where = L.ns_prefix_sql(prefix)
            if where:
                query = query.where(where)
            keys.update(query.select(["namespace"]).limit(None).to_arrow().column("namespace").unique().to_pylist())
        return sorted(L.ns_parse(k) for k in keys)

    def search(
        self,
        namespace: Namespace,
        query: str,
        kind: MemoryKind | None = None,
        k: int = 10,
        mode: SearchMode = "hybrid",
        status: str | None = "active",
        where: str | None = None,
        since: str | None = None,
        until: str | None = None,
        vector: Sequence[float] | None = None,
    ) -> builtins.list[ScoredItem]:
        """Search one namespace."""
        if mode not in ("hybrid", "vector", "fts"):
            raise ConfigurationError(f"search mode {mode!r} is not one of hybrid, vector, fts")
        scope = L.Scope(tuple(namespace), status, where, since, until)
        if mode != "fts" and vector is None:
            vector = self.embeddings.embed_query(query)
        hits: builtins.list[ScoredItem] = []
        for kd in ["fact", "insight"] if kind is None else [kind]:
            rows = self._search_rows(kd, query, vector, k, mode, scope)
            hits.extend(ScoredItem(row_to_item(r), s) for r, s in rows)
        hits.sort(key=lambda h: -h.score)
        return hits[:k]

    def search_vectors(
        self,
        namespace: Namespace,
        vector: Sequence[float],
        k: int = 10,
        kind: MemoryKind = "fact",
        where: str | None = None,
    ) -> builtins.list[tuple[str, float]]:
        """Return ``(id, cosine score)`` of the ``k`` nearest active items, without parsing items."""
        rows = self._vector_rows(kind, vector, k, L.Scope(tuple(namespace), "active", where), ["id"])
        return [(r["id"], 1.0 - r["_distance"]) for r in rows]

    def dual_search(
        self,
        namespace: Namespace,
        query: str,
        k_facts: int = 10,
        k_insights: int = 10,
        mode: SearchMode = "hybrid",
        merged: bool = False,
        expand: bool = True,
    ) -> DualResult:
        """Search facts and insights; expand insights with their cited facts."""
        vector = None if mode == "fts" else self.embeddings.embed_query(query)
        if merged:
            k = max(k_facts, k_insights)
            pool = self.search(namespace, query, k=k, mode=mode, vector=vector)
            result = DualResult(merged=pool)
            result.facts = [h for h in pool if h.item.kind == "fact"]
            result.insights = [h for h in pool if h.item.kind == "insight"]
        else:
            facts = self.search(namespace, query, kind="fact", k=k_facts, mode=mode, vector=vector)
            insights = self.search(namespace, query, kind="insight", k=k_insights, mode=mode, vector=vector)
            result = DualResult(facts=facts, insights=insights)
        if expand and result.insights:
            cited = [fid for h in result.insights for fid in h.item.grounding]
            by_id = {f.id: f for f in self.get(list(dict.fromkeys(cited)))}
            result.grounding = {h.item.id: [by_id[f] for f in h.item.grounding if f in by_id] for h in result.insights}
        return result

    # ------------------------------------------------------------------ ledger

    def chunk_applied(self, namespace: Namespace, chunk_id: str) -> bool:
        """Return True if the writer already applied ``chunk_id``."""
        return self._ledger.count_rows(f"id = {L.sql_str(_ledger_id(namespace, chunk_id))}") > 0

    def mark_chunk_applied(self, namespace: Namespace, chunk_id: str, payload: str = "") -> None:
        """Record that ``chunk_id`` was applied (payload: the update JSON)."""
        row = {
            "id": _ledger_id(namespace, chunk_id),
            "namespace": L.ns_key(namespace),
            "chunk_id": chunk_id,
            "payload": payload,
            "applied_at": utcnow(),
        }
        self._merge(self._ledger, [row])

    def ledger_payload(self, namespace: Namespace, chunk_id: str) -> str | None:
        """Return the payload recorded for ``chunk_id`` (None if it was not applied)."""
        rows = L.query_rows(self._ledger, f"id = {L.sql_str(_ledger_id(namespace, chunk_id))}", ["payload"], 1)
        return rows[0]["payload"] if rows else None

    # ------------------------------------------------------------------ internals

    def _pick(self, kind: MemoryKind | None) -> builtins.list[Any]:
        if kind is None:
            return list(self._tables.values())
        if kind not in self._tables:
            raise ConfigurationError(f"memory kind {kind!r} is not one of fact, insight")
        return [self._tables[kind]]

    def _search_rows(
        self, kind: str, query: str, vector: Any, k: int, mode: str, scope: L.Scope
    ) -> builtins.list[tuple[dict[str, Any], float]]:
        table = self._tables[kind]
        filt = scope.sql()
        if mode == "vector":
            return [(r, 1.0 - r.pop("_distance")) for r in self._vector_rows(kind, vector, k, scope)]
        if self._dirty[kind]:
            self._refresh_fts(kind)
        if mode == "fts":
            return [(r, float(r.pop("_score"))) for r in self._fts_rows(table, query, k, filt)]
        fetch = max(2 * k, 20)
        vec_rows = self._vector_rows(kind, vector, fetch, scope)
        fts_rows = self._fts_rows(table, query, fetch, filt)
        return L.rrf_fuse([vec_rows, fts_rows], k, RRF_K)

    def _cached(self, kind: str, scope: L.Scope) -> _vcache.Entry | None:
        """Return the namespace's in-RAM entry (loading it); None when the scope is not cacheable."""
        if scope.status != "active":
            return None
        key = (self.uri, kind, L.ns_key(scope.namespace))
        entry = self._cache.get(key)
        if entry is None:
            stamp = _vcache.stamp(key)
            where = L.Scope(scope.namespace, "active").sql()
            entry = _vcache.load(self._tables[kind], where, ITEM_COLUMNS, self.dims, self.flat_search_max_rows, stamp)
            self._cache.put(key, entry)
        return entry if entry.matrix is not None else None

    def _vector_rows(
        self, kind: str, vector: Any, k: int, scope: L.Scope, columns: builtins.list[str] | None = None
    ) -> builtins.list[dict[str, Any]]:
        table = self._tables[kind]
        columns = columns or ITEM_COLUMNS
        entry = self._cached(kind, scope)
        if entry is not None:  # exact search in RAM; `where` (arbitrary SQL) is resolved by LanceDB
            ids = None
            if scope.where:
                ids = {r["id"] for r in L.query_rows(table, scope.sql(), ["id"])}
            mask = entry.mask(since=scope.since, until=scope.until, ids=ids)
            return entry.top(np.asarray(vector, dtype=np.float32), k, mask, columns)
        query = table.search(list(vector), vector_column_name="vector").distance_type("cosine")
        query = query.where(scope.sql(), prefilter=True)
        if self._vector_indexed[kind]:
            if table.count_rows(L.ns_eq_sql(scope.namespace)) <= self.flat_search_max_rows:
                query = query.bypass_vector_index()  # exact: a small namespace is cheaper to scan
            else:
                query = query.nprobes(32).refine_factor(5)
        return query.select([*columns, "_distance"]).limit(k).to_arrow().to_pylist()

    def _fts_rows(self, table: Any, query: str, k: int, filt: str | None) -> builtins.list[dict[str, Any]]:
        if not query.strip():
            return []
        search = table.search(query, query_type="fts", fts_columns="text")
        if filt:
            search = search.where(filt, prefilter=True)
        return search.select([*ITEM_COLUMNS, "_score"]).limit(k).to_arrow().to_pylist()

    def _refresh_fts(self, kind: str) -> None:
        table = self._tables[kind]
        if not L.has_index(table, "text"):
            L.ensure_base_indexes(table)
        elif L.unindexed_rows(table, "text") >= self.fts_reindex_rows:
            table.optimize()
        self._dirty[kind] = False


def _dims_of(embeddings: Embeddings) -> int:
    from dualmem.models import embedding_dims

    return embedding_dims(embeddings)


def _ledger_id(namespace: Namespace, chunk_id: str) -> str:
    return stable_id(L.ns_key(namespace), chunk_id, prefix="chunk-")
