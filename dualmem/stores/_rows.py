"""Arrow schemas of the dual store's tables and MemoryItem <-> row conversion."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

import dualmem.stores._lance as L
from dualmem.schema import EMOTIONS, MemoryItem, SourceRef, utcnow
from dualmem.stores._sql import ns_key, ns_parse, row_key

TS = pa.timestamp("us", tz="UTC")
ITEM_COLUMNS = [
    "pk",
    "id",
    "namespace",
    "kind",
    "text",
    "session_id",
    "turn_ids",
    "chunk_id",
    "event_time",
    "created_at",
    "updated_at",
    "grounding",
    "emotion",
    "status",
    "meta",
]
LEDGER_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("namespace", pa.string()),
        pa.field("chunk_id", pa.string()),
        pa.field("payload", pa.string()),
        pa.field("applied_at", TS),
    ]
)


UNIT_VECTORS = {b"dualmem.vectors": b"unit"}  # schema metadata of tables whose every vector is stored unit-normalised


def unit_vector(vector: Sequence[float]) -> list[float]:
    """Return ``vector`` scaled to unit length (a zero vector stays zero), as float16 stores it."""
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float16).astype(np.float32).tolist()


def unit_vectors(table: Any) -> bool:
    """Return True if ``table``'s schema says its vectors are stored unit-normalised."""
    metadata = table.schema.metadata or {}
    return all(metadata.get(k) == v for k, v in UNIT_VECTORS.items())


def item_schema(dims: int) -> pa.Schema:
    """Return the schema of the facts/insights tables for ``dims``-dim vectors.

    Vectors are stored as float16: a search reads half the bytes (a namespace scan is
    bound by them) and cosine scores move by less than 1e-3. Tables made by older
    versions with float32 vectors keep working. Vectors are stored unit-normalised
    (``UNIT_VECTORS`` in the schema metadata says so), which lets LanceDB's exact scan
    rank by L2 distance, its faster kernel, with cosine = 1 - L2^2 / 2.
    """
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("namespace", pa.string(), nullable=False),
            pa.field("kind", pa.string()),
            pa.field("text", pa.string()),
            pa.field("vector", pa.list_(pa.float16(), dims)),
            pa.field("session_id", pa.string()),
            pa.field("turn_ids", pa.list_(pa.string())),
            pa.field("chunk_id", pa.string()),
            pa.field("event_time", pa.string()),
            pa.field("created_at", TS),
            pa.field("updated_at", TS),
            pa.field("grounding", pa.list_(pa.string())),
            pa.field("emotion", pa.list_(pa.float32(), len(EMOTIONS)), nullable=True),
            pa.field("status", pa.string()),
            pa.field("meta", pa.string()),
            pa.field("pk", pa.string(), nullable=False),
        ],
        metadata=UNIT_VECTORS,
    )


# an older table (before namespace-scoped keys) gets its ``pk`` computed from these columns
PK_SQL = {"pk": "concat(namespace, id)"}


def item_to_row(
    item: MemoryItem,
    vector: Sequence[float],
    *,
    created_at: datetime,
    updated_at: datetime,
    dims: int,
) -> dict[str, Any]:
    """Return the table row of ``item``."""
    if len(vector) != dims:
        raise ValueError(f"item {item.id!r}: vector has {len(vector)} dims, the store holds {dims}-dim vectors")
    return {
        "pk": row_key(item.namespace, item.id),
        "id": item.id,
        "namespace": ns_key(item.namespace),
        "kind": item.kind,
        "text": item.text,
        "vector": unit_vector(vector),  # exactly what is stored
        "session_id": item.source.session_id,
        "turn_ids": list(item.source.turn_ids),
        "chunk_id": item.source.chunk_id,
        "event_time": item.event_time,
        "created_at": L.utc(created_at),
        "updated_at": L.utc(updated_at),
        "grounding": list(item.grounding),
        "emotion": None if item.emotion is None else [float(v) for v in item.emotion],
        "status": item.status,
        "meta": json.dumps(item.meta, ensure_ascii=False, default=str),
    }


def row_to_item(row: dict[str, Any]) -> MemoryItem:
    """Return the MemoryItem stored in ``row``."""
    return MemoryItem(
        id=row["id"],
        namespace=ns_parse(row["namespace"]),
        kind=row["kind"],
        text=row["text"],
        source=SourceRef(session_id=row["session_id"], turn_ids=row["turn_ids"] or [], chunk_id=row["chunk_id"]),
        event_time=row["event_time"],
        created_at=L.utc(row["created_at"]) or utcnow(),
        updated_at=L.utc(row["updated_at"]) or utcnow(),
        grounding=row["grounding"] or [],
        emotion=row["emotion"],
        status=row["status"],
        meta=json.loads(row["meta"]) if row["meta"] else {},
    )
