"""LangGraph key-value items on LanceDB: a ``BaseStore`` with semantic search and TTL, shared across processes.

``lg_items`` holds one row per item, keyed by ``id`` (a stable hash of namespace
and key, declared LanceDB's unenforced primary key, so concurrent puts of one
key from threads, processes or machines leave one row: the put that commits
last wins); ``lg_vectors`` one row per indexed text of an item (key
``item_id:path``), tagged with the ``rev`` of the value it was computed from. A
search scores an item by its best field (max-pooled, as LangGraph's stores do)
among the vectors of its current ``rev``; an item whose vectors do not match
its value (a put racing another) is listed after the scored ones, unscored.
Every read goes to the tables (fresh across processes); nothing is cached.

Only ``batch``/``abatch`` are implemented: reads see the store before the
batch's writes, then the batch's puts are applied (the last put of a key wins),
as in LangGraph's own stores. ``abatch`` embeds asynchronously and applies in a
worker thread. TTL: ``put(..., ttl=minutes)``; reads with ``refresh_ttl`` extend
an item's expiry; :meth:`LanceKVStore.sweep_ttl` deletes expired items, and the
sweeper thread (``start_ttl_sweeper``) does so every interval and logs failures.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

import dualmem.stores._lance as L
from dualmem.schema import utcnow
from dualmem.stores._kv_schema import (
    _MIGRATE,
    DISTANCES,
    ITEM_COLS,
    ITEMS,
    ITEMS_SCHEMA,
    VECTORS,
    expiry,
    item_id,
    vectors_schema,
)
from dualmem.stores._match import list_namespaces, matches
from dualmem.stores._rows import one_per_key, utc
from dualmem.stores._sql import and_all, ns_key, ns_parse, ns_prefix_sql, sql_in
from dualmem.stores._sweeper import Stopped, Sweeper, SweeperFuture
from dualmem.vectors import dots


class _Plan:
    """What a batch will do: the ops, the last put of each key, the queries and texts to embed."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        self.queries: list[str] = []
        self.texts: list[tuple[str, str, str]] = []  # (item id, path, text)


class LanceKVStore(BaseStore):
    """LangGraph store items in LanceDB (see the module docstring)."""

    supports_ttl = True

    def __init__(
        self,
        uri: str,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        storage_options: Mapping[str, str] | str | None = None,
        db: Any = None,
    ) -> None:
        self.uri = str(uri)
        self.ttl_config: TTLConfig | None = dict(ttl) if ttl else None  # type: ignore[assignment]
        self.db = db if db is not None else L.connect(self.uri, L.storage_options(storage_options))
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Any = None
        self._fields: list[tuple[str, Any]] = []
        if index:
            self.index_config = dict(index)
            self.embeddings = ensure_embeddings(index.get("embed"))
            given: Any = index.get("fields") or dict(index).get("text_fields")  # SQLite's stores call it text_fields
            self._fields = [(p, tokenize_path(p) if p != "$" else p) for p in list(given or ["$"])]
        self.distance = str((index or {}).get("distance_type") or "cosine")
        if self.distance not in DISTANCES:
            raise ValueError(f"index distance_type {self.distance!r} is not one of {sorted(DISTANCES)}")
        self.items = L.open_or_create(self.db, ITEMS, ITEMS_SCHEMA)
        L.migrate_columns(self.items, ITEMS_SCHEMA, _MIGRATE)
        L.ensure_primary_key(self.items, "id")
        L.ensure_indexes(self.items, L.base_index_configs({"id": "BTREE", "namespace": "BITMAP"}))
        self.vectors: Any = None
        if index:
            dims = int(index["dims"])
            self.vectors = L.open_or_create(self.db, VECTORS, vectors_schema(dims))
            L.check_dims(self.vectors, "vector", dims, self.uri)
            L.migrate_columns(self.vectors, vectors_schema(dims), {"rev": "CAST(NULL AS STRING)"})
            L.ensure_primary_key(self.vectors, "id")
            L.ensure_indexes(self.vectors, L.base_index_configs({"item_id": "BTREE", "namespace": "BITMAP"}))
        self._sweeper = Sweeper(self.sweep_ttl)

    # ------------------------------------------------------------------ shells

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops`` and return one result per op (reads see the store before the batch's writes)."""
        plan = self._plan(ops)
        emb = self.embeddings
        qvecs = [emb.embed_query(q) for q in plan.queries] if emb and plan.queries else []
        dvecs = emb.embed_documents([t for _, _, t in plan.texts]) if emb and plan.texts else []
        return self._execute(plan, qvecs, dvecs)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`: embeds with the embedder's async methods, applies in a worker thread."""
        plan = self._plan(ops)
        emb = self.embeddings
        qvecs = list(await asyncio.gather(*(emb.aembed_query(q) for q in plan.queries))) if emb else []
        dvecs = await emb.aembed_documents([t for _, _, t in plan.texts]) if emb and plan.texts else []
        return await asyncio.to_thread(self._execute, plan, qvecs, dvecs)

    def _plan(self, ops: Iterable[Op]) -> _Plan:
        plan = _Plan(list(ops))
        for op in plan.ops:
            if isinstance(op, SearchOp):
                if op.query and self.embeddings and op.query not in plan.queries:
                    plan.queries.append(op.query)
            elif isinstance(op, PutOp):
                plan.puts[(tuple(op.namespace), op.key)] = op  # the last write of a key wins
            elif not isinstance(op, GetOp | ListNamespacesOp):
                raise ValueError(f"unknown store operation {type(op).__name__}; expected Get/Put/Search/ListNamespaces")
        if self.index_config:
            for (ns, key), op in plan.puts.items():
                if op.value is None or op.index is False:
                    continue
                paths = self._fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
                for path, tokens in paths:
                    texts = get_text_at_path(op.value, tokens)
                    for j, text in enumerate(texts):
                        plan.texts.append((item_id(ns, key), f"{path}.{j}" if len(texts) > 1 else path, text))
        return plan

    def _execute(self, plan: _Plan, qvecs: list[list[float]], dvecs: list[list[float]]) -> list[Result]:
        results: list[Result] = [None] * len(plan.ops)
        qmap = dict(zip(plan.queries, qvecs, strict=True))
        refresh: dict[str, dict[str, Any]] = {}
        wanted = {item_id(op.namespace, op.key) for op in plan.ops if isinstance(op, GetOp)}
        found = {r["id"]: r for r in self.rows(sql_in("id", wanted))} if wanted else {}  # the batch's gets: one scan
        for i, op in enumerate(plan.ops):
            if isinstance(op, GetOp):
                results[i] = self._get(op, found, refresh)
            elif isinstance(op, SearchOp):
                results[i] = self.search_all(op, qmap.get(op.query) if op.query else None, refresh)[
                    op.offset : op.offset + op.limit
                ]
            elif isinstance(op, ListNamespacesOp):
                results[i] = list_namespaces(self.namespaces(), op)
        if plan.puts:
            self._apply_puts(plan, dvecs)
        if refresh:
            self._refresh(refresh.values())
        return results

    def __enter__(self) -> LanceKVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_ttl_sweeper()

    async def __aenter__(self) -> LanceKVStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop_ttl_sweeper()

    # ------------------------------------------------------------------ reads

    def _omit_expired(self) -> bool:
        return bool((self.ttl_config or {}).get("omit_expired", False))

    def rows(self, where: str | None) -> list[dict[str, Any]]:
        """Return item rows matching ``where`` (live ones only when the TTL config omits expired items)."""
        live = f"expires_at IS NULL OR expires_at > {time.time()!r}" if self._omit_expired() else None
        return one_per_key(L.scan(self.items, and_all(where, live), ITEM_COLS), "id").to_pylist()

    @staticmethod
    def _get(op: GetOp, found: dict[str, dict[str, Any]], refresh: dict[str, dict[str, Any]]) -> Item | None:
        row = found.get(item_id(op.namespace, op.key))
        if row is None:
            return None
        if op.refresh_ttl:
            refresh[row["id"]] = row
        return to_item(row)

    def search_all(
        self, op: SearchOp, qvec: Sequence[float] | None, refresh: dict[str, dict[str, Any]]
    ) -> list[SearchItem]:
        """Return the items of a search up to ``offset + limit`` (the caller pages): scored best first when
        ``qvec``, then unscored ones; newest update first without a query."""
        candidates = self.rows(ns_prefix_sql(tuple(op.namespace_prefix)))
        if op.filter:
            candidates = [r for r in candidates if matches(json.loads(r["value"]), op.filter)]
        want = op.offset + op.limit
        if qvec is None or self.vectors is None:
            candidates.sort(key=lambda r: (r["updated_at"], r["key"]), reverse=True)
            page = candidates[:want]
            out = [to_item(r, None) for r in page]
        else:
            scores = self._scores({r["id"]: r for r in candidates}, qvec)
            scored = sorted((r for r in candidates if r["id"] in scores), key=lambda r: (-scores[r["id"]], r["key"]))
            unscored = sorted(
                (r for r in candidates if r["id"] not in scores),
                key=lambda r: (r["updated_at"], r["key"]),
                reverse=True,
            )
            page = (scored + unscored)[:want]
            out = [to_item(r, scores.get(r["id"])) for r in page]
        if op.refresh_ttl:
            refresh.update({r["id"]: r for r in page})
        return out

    def _scores(self, rows: dict[str, dict[str, Any]], qvec: Sequence[float]) -> dict[str, float]:
        """Return the best field score of each item among the vectors of its current value."""
        if not rows:
            return {}
        vecs = one_per_key(L.scan(self.vectors, sql_in("item_id", rows), ["id", "item_id", "rev", "vector"]), "id")
        current = [r for r in vecs.to_pylist() if r["rev"] == rows[r["item_id"]].get("rev")]
        if not current:
            return {}
        mat = np.asarray([r["vector"] for r in current], dtype=np.float32)
        q = np.asarray(qvec, dtype=np.float32)
        if self.distance == "cosine":
            sims = dots(mat, q) / np.maximum(np.linalg.norm(mat, axis=1) * np.linalg.norm(q), 1e-12)
        elif self.distance == "inner_product":
            sims = dots(mat, q)
        else:
            sims = -np.linalg.norm(mat - q, axis=1)
        scores: dict[str, float] = {}
        for r, s in zip(current, sims.tolist(), strict=True):
            scores[r["item_id"]] = max(scores.get(r["item_id"], -math.inf), float(s))
        return scores

    def namespaces(self) -> list[tuple[str, ...]]:
        """Return every namespace holding items."""
        live = f"expires_at IS NULL OR expires_at > {time.time()!r}" if self._omit_expired() else None
        return [ns_parse(k) for k in L.scan(self.items, live, ["namespace"]).column("namespace").unique().to_pylist()]

    # ------------------------------------------------------------------ writes

    def _apply_puts(self, plan: _Plan, dvecs: list[list[float]]) -> None:
        ids = {k: item_id(*k) for k in plan.puts}
        old = {r["id"]: r["created_at"] for r in self.rows(sql_in("id", ids.values()))}
        now, clock = utcnow(), time.time()
        rows, deleted, revs = [], [], {}
        for (ns, key), op in plan.puts.items():
            iid = ids[(ns, key)]
            if op.value is None:
                deleted.append(iid)
                continue
            revs[iid] = uuid.uuid4().hex
            rows.append(
                {
                    "id": iid,
                    "namespace": ns_key(ns),
                    "key": key,
                    "value": json.dumps(op.value, ensure_ascii=False, default=str),
                    "created_at": old.get(iid, now),
                    "updated_at": now,
                    "ttl_minutes": None if op.ttl is None else float(op.ttl),
                    "expires_at": expiry(op.ttl, clock),
                    "rev": revs[iid],
                }
            )
        nskeys = {iid: ns_key(k[0]) for k, iid in ids.items()}
        vectors = [
            {
                "id": f"{iid}:{path}",
                "item_id": iid,
                "namespace": nskeys[iid],
                "path": path,
                "vector": vec,
                "rev": revs[iid],
            }
            for (iid, path, _), vec in zip(plan.texts, dvecs, strict=True)
            if iid in revs
        ]
        if vectors:  # before the item: its value never shows with no vector it could have
            data = pa.Table.from_pylist(vectors, schema=self.vectors.schema)
            L.retry(
                lambda: (
                    self.vectors.merge_insert("id")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute(data)
                )
            )
        if rows:
            data = pa.Table.from_pylist(rows, schema=self.items.schema)
            L.retry(
                lambda: (
                    self.items.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
                )
            )
        if deleted:
            L.retry(lambda: self.items.delete(sql_in("id", deleted)))
            if self.vectors is not None:
                L.retry(lambda: self.vectors.delete(sql_in("item_id", deleted)))

    def _refresh(self, rows: Iterable[dict[str, Any]]) -> None:
        """Extend the expiry of items read with ``refresh_ttl`` (those with a TTL): one commit per TTL value.

        Best effort: a refresh that keeps losing commit races is given up (the read still succeeds).
        """
        now = time.time()
        by_ttl: dict[float, list[dict[str, Any]]] = {}
        for row in rows:
            if row.get("ttl_minutes") is not None:
                by_ttl.setdefault(float(row["ttl_minutes"]), []).append(row)
        for ttl, group in by_ttl.items():
            values = {"expires_at": expiry(ttl, now)}
            where = sql_in("id", [r["id"] for r in group])
            try:
                L.retry(lambda w=where, v=values: self.items.update(where=w, values=v), attempts=8)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a refresh must never fail a read
                continue

    # ------------------------------------------------------------------ TTL and upkeep

    def sweep_ttl(self) -> int:
        """Delete every expired item (and its vectors); return how many were deleted.

        The expiry is part of the delete's own predicate, evaluated at its commit: an item another
        process refreshed or put again after the scan is kept, with its vectors.
        """
        expired = f"expires_at IS NOT NULL AND expires_at <= {time.time()!r}"
        ids = [r["id"] for r in L.query_rows(self.items, expired, ["id"])]
        if not ids:
            return 0
        L.retry(lambda: self.items.delete(and_all(sql_in("id", ids), expired)))
        kept = {r["id"] for r in L.query_rows(self.items, sql_in("id", ids), ["id"])}
        gone = [i for i in ids if i not in kept]
        if self.vectors is not None and gone:
            L.retry(lambda: self.vectors.delete(sql_in("item_id", gone)))
        return len(gone)

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> SweeperFuture:
        """Sweep expired items in a background thread every interval (default: the TTL config's, else 5 min).

        Returns at once, a future done when the sweeper stops; ``await`` on it works too (async callers).
        """
        if not self.ttl_config:
            return SweeperFuture.finished()
        return self._sweeper.start(sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes") or 5)

    def stop_ttl_sweeper(self, timeout: float | None = None) -> Stopped:
        """Stop the background sweeper; true once it has stopped (or none was running); awaitable too."""
        return self._sweeper.stop(timeout)

    def maintain(self) -> dict[str, int]:
        """Repair duplicate rows of one key left by older versions (keeping the latest), compact the tables and drop
        old versions; return how many duplicates went and how many items are left."""
        repaired = L.repair_duplicates(self.items, "id")
        for table in (self.items, self.vectors):
            if table is not None:
                L.optimize(table, keep_versions_for=L.KEEP_VERSIONS)
        return {"duplicates_removed": repaired, "kv_items": self.items.count_rows()}


def to_item(row: dict[str, Any], score: float | None | bool = False) -> Any:
    """Return the LangGraph ``Item`` (``SearchItem`` when ``score`` is given) of an item row."""
    kwargs = {
        "namespace": ns_parse(row["namespace"]),
        "key": row["key"],
        "value": json.loads(row["value"]),
        "created_at": utc(row["created_at"]),
        "updated_at": utc(row["updated_at"]),
    }
    if score is False:
        return Item(**kwargs)
    return SearchItem(**kwargs, score=None if score is None else float(score))
