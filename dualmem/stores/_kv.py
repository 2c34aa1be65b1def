"""Key-value items of the LangGraph store in LanceDB: values by (namespace, key), field vectors, expiry.

``lg_items`` holds one row per item (stable id from namespace + key, the
namespace as its JSON array, the value as JSON, created/updated time, and for
items put with a TTL ``ttl_minutes`` and ``expires_at``); ``lg_vectors`` one row
per indexed text of an item (item id, field path, vector). A query search
max-pools an item's field scores, as LangGraph's stores do. Every read goes to
the tables (fresh across processes); nothing is cached.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.schema import stable_id
from dualmem.stores._sql import and_all, ns_key, ns_parse, sql_in

ITEMS, VECTORS = "lg_items", "lg_vectors"
_TS = pa.timestamp("us", tz="UTC")
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("namespace", pa.string()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("created_at", _TS),
        pa.field("updated_at", _TS),
        pa.field("ttl_minutes", pa.float64()),
        pa.field("expires_at", pa.float64()),  # epoch seconds; null: never expires
    ]
)
ITEM_COLS = ["id", "namespace", "key", "value", "created_at", "updated_at", "ttl_minutes", "expires_at"]
_MIGRATE = {"ttl_minutes": "CAST(NULL AS DOUBLE)", "expires_at": "CAST(NULL AS DOUBLE)"}


def vectors_schema(dims: int) -> pa.Schema:
    """Return the schema of the field-vector table."""
    return pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("item_id", pa.string()),
            pa.field("namespace", pa.string()),
            pa.field("path", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dims)),
        ]
    )


def item_id(namespace: Sequence[str], key: str) -> str:
    """Return the stored id of the item (namespace, key)."""
    return stable_id(ns_key(namespace), key, prefix="kv-")


def expiry(ttl_minutes: float | None, now: float) -> float | None:
    """Return when (epoch seconds) an item put or refreshed at ``now`` with ``ttl_minutes`` expires (None: never)."""
    if ttl_minutes is None:
        return None
    if not math.isfinite(float(ttl_minutes)) or ttl_minutes < 0:
        raise ValueError(f"ttl must be a non-negative number of minutes, got {ttl_minutes!r}")
    return now + 60.0 * float(ttl_minutes)


# LangGraph's distance names -> (LanceDB's, score from LanceDB's distance d) as LangGraph's Postgres store reports them
DISTANCES = {
    "cosine": ("cosine", lambda d: 1.0 - d),
    "inner_product": ("dot", lambda d: 1.0 - d),  # LanceDB's dot distance is 1 - a.b
    "l2": ("l2", lambda d: -math.sqrt(max(d, 0.0))),  # LanceDB's l2 distance is squared
}


class KVTables:
    """The item and vector tables of one LangGraph store."""

    def __init__(self, db: Any, dims: int | None, uri: str, distance: str = "cosine") -> None:
        if distance not in DISTANCES:
            raise ValueError(f"index distance_type {distance!r} is not one of {sorted(DISTANCES)}")
        self.distance = distance
        self.items = L.open_or_create(db, ITEMS, ITEMS_SCHEMA)
        L.migrate_columns(self.items, ITEMS_SCHEMA, _MIGRATE)
        L.ensure_indexes(self.items, L.base_index_configs({"id": "BTREE", "namespace": "BITMAP"}))
        self.vectors: Any = None
        if dims:
            self.vectors = L.open_or_create(db, VECTORS, vectors_schema(dims))
            L.check_dims(self.vectors, "vector", dims, uri)
            L.ensure_indexes(self.vectors, L.base_index_configs({"item_id": "BTREE", "namespace": "BITMAP"}))
        self._maintain = L.AutoOptimize()

    # ------------------------------------------------------------------ reads

    def rows(self, where: str | None, omit_expired: bool = False) -> list[dict[str, Any]]:
        """Return item rows matching ``where`` (live ones only with ``omit_expired``)."""
        live = f"expires_at IS NULL OR expires_at > {time.time()!r}" if omit_expired else None
        return L.query_rows(self.items, and_all(where, live), ITEM_COLS)

    def by_ids(self, ids: Iterable[str], omit_expired: bool = False) -> dict[str, dict[str, Any]]:
        """Return item rows by id."""
        ids = list(set(ids))
        return {r["id"]: r for r in self.rows(sql_in("id", ids), omit_expired)} if ids else {}

    def nearest(self, where: str | None, qvec: Sequence[float], want: int, allowed: set[str] | None) -> dict[str, float]:
        """Return max-pooled cosine scores of the best ``want`` items (among ``allowed`` ids when given)."""
        if self.vectors is None:
            return {}
        if allowed is not None:
            return self.score_ids(allowed, qvec)
        fetch = max(want * 2, 20)
        lance_name, score = DISTANCES[self.distance]
        while True:
            rows = L.nearest(self.vectors, qvec, fetch, where, ["item_id"], distance=lance_name).to_pylist()
            scores: dict[str, float] = {}
            for r in rows:  # rows come best first: the first per item is its best field
                scores.setdefault(r["item_id"], score(r["_distance"]))
            if len(scores) >= want or len(rows) < fetch:
                return scores
            fetch *= 4

    def score_ids(self, ids: set[str], qvec: Sequence[float]) -> dict[str, float]:
        """Return the max-pooled cosine score of each of ``ids`` that has vectors."""
        if not ids or self.vectors is None:
            return {}
        rows = L.query_rows(self.vectors, sql_in("item_id", ids), ["item_id", "vector"])
        if not rows:
            return {}
        mat = np.asarray([r["vector"] for r in rows], dtype=np.float32)
        q = np.asarray(qvec, dtype=np.float32)
        if self.distance == "cosine":
            sims = mat @ q / np.maximum(np.linalg.norm(mat, axis=1) * np.linalg.norm(q), 1e-12)
        elif self.distance == "inner_product":
            sims = mat @ q
        else:
            sims = -np.linalg.norm(mat - q, axis=1)
        scores: dict[str, float] = {}
        for r, s in zip(rows, sims.tolist(), strict=True):
            scores[r["item_id"]] = max(scores.get(r["item_id"], -2.0), s)
        return scores

    def namespaces(self, omit_expired: bool = False) -> list[tuple[str, ...]]:
        """Return every namespace holding items."""
        live = f"expires_at IS NULL OR expires_at > {time.time()!r}" if omit_expired else None
        col = L.scan(self.items, live, ["namespace"]).column("namespace")
        return [ns_parse(k) for k in col.unique().to_pylist()]

    # ------------------------------------------------------------------ writes

    def write(self, rows: list[dict[str, Any]], deleted: list[str], vectors: list[dict[str, Any]] | None, reindexed: list[str]) -> None:
        """Upsert item rows, delete items, and replace the vectors of ``reindexed`` items."""
        if deleted:
            L.retry(lambda: self.items.delete(sql_in("id", deleted)))
        if rows:
            data = pa.Table.from_pylist(rows, schema=self.items.schema)
            L.retry(lambda: self.items.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data))
        if self.vectors is not None and (deleted or reindexed):
            gone = sql_in("item_id", [*deleted, *reindexed])
            L.retry(lambda: self.vectors.delete(gone))
        if self.vectors is not None and vectors:
            vdata = pa.Table.from_pylist(vectors, schema=self.vectors.schema)
            L.retry(lambda: self.vectors.add(vdata))
        for table in (self.items, self.vectors):
            if table is not None:
                self._maintain.committed(table)

    def refresh(self, rows: Iterable[dict[str, Any]]) -> None:
        """Extend the expiry of items read with ``refresh_ttl`` (those with a TTL): one commit per TTL value.

        Best effort: a refresh that keeps losing commit races is given up (the read still succeeds).
        """
        now = time.time()
        by_ttl: dict[float, list[dict[str, Any]]] = {}
        for row in rows:
            if row.get("ttl_minutes") is not None:
                by_ttl.setdefault(float(row["ttl_minutes"]), []).append(row)
        for ttl, group in by_ttl.items():
            until = expiry(ttl, now)
            where = sql_in("id", [r["id"] for r in group])
            try:
                L.retry(lambda w=where, u=until: self.items.update(where=w, values={"expires_at": u}), attempts=8)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a refresh must never fail a read
                continue
            self._maintain.committed(self.items)
            for row in group:
                row["expires_at"] = until

    def sweep(self) -> int:
        """Delete expired items (and their vectors); return how many were deleted.

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
        for table in (self.items, self.vectors):
            if table is not None:
                self._maintain.committed(table)
        return len(gone)


def value_json(value: Any) -> str:
    """Return the stored JSON of an item value."""
    return json.dumps(value, ensure_ascii=False, default=str)
