"""The two tables of :mod:`dualmem.stores.kv`: their schemas, item ids, expiry times and LangGraph's distance names."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyarrow as pa

from dualmem.schema import stable_id
from dualmem.stores._sql import ns_key

ITEMS, VECTORS = "lg_items", "lg_vectors"
_TS = pa.timestamp("us", tz="UTC")
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("namespace", pa.string()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("created_at", _TS),
        pa.field("updated_at", _TS),
        pa.field("ttl_minutes", pa.float64()),
        pa.field("expires_at", pa.float64()),  # epoch seconds; null: never expires
        pa.field("rev", pa.string()),
    ]
)
ITEM_COLS = ITEMS_SCHEMA.names
_MIGRATE = {"ttl_minutes": "CAST(NULL AS DOUBLE)", "expires_at": "CAST(NULL AS DOUBLE)", "rev": "CAST(NULL AS STRING)"}
# LangGraph's distance names -> (LanceDB's, score from LanceDB's distance d), as LangGraph's Postgres store reports them
DISTANCES = {
    "cosine": ("cosine", lambda d: 1.0 - d),
    "inner_product": ("dot", lambda d: 1.0 - d),  # LanceDB's dot distance is 1 - a.b
    "l2": ("l2", lambda d: -math.sqrt(max(d, 0.0))),  # LanceDB's l2 distance is squared
}


def vectors_schema(dims: int) -> pa.Schema:
    """Return the schema of the field-vector table."""
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("item_id", pa.string()),
            pa.field("namespace", pa.string()),
            pa.field("path", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dims)),
            pa.field("rev", pa.string()),
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
