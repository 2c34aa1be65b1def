"""The row format of the dual memory, shared by both backends: arrow schema, MemoryItem <-> row, one row per key.

A row is a ``MemoryItem`` flattened: ``pk`` (namespace key + id, the row's key),
the namespace as its JSON array string, source fields as columns, ``meta`` as
JSON, and the vector unit-normalised and rounded to float16 (what LanceDB
stores; the in-memory backend stores the same numbers, so both rank alike).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
STAMP_COLUMNS = ["pk", "id", "updated_at"]  # a stamps scan adds ``row`` (uint64): where the backend holds the row


def row_addresses(at: Sequence[Any]) -> tuple[int | None, ...]:
    """Return ``at`` (a stamps scan's ``row`` values, passed back to a scan) as a tuple, or raise naming them."""
    if not all(a is None or (isinstance(a, int) and not isinstance(a, bool) and a >= 0) for a in at):
        raise ValueError("scan(at=...) takes the `row` values of a stamps scan: integers of 0 or more, or None")
    return tuple(at)


def item_schema(dims: int) -> pa.Schema:
    """Return the schema of the memory table for ``dims``-dim vectors (stored as float16, unit length)."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
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
        ]
    )


def utc(value: datetime | None) -> datetime | None:
    """Return ``value`` as an aware UTC datetime (naive values are taken as UTC)."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def unit_vector(vector: Sequence[float]) -> list[float]:
    """Return ``vector`` scaled to unit length (a zero vector stays zero), rounded to float16 as stored."""
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float16).astype(np.float32).tolist()


def item_to_row(
    item: MemoryItem, vector: Sequence[float], *, created_at: datetime, updated_at: datetime, dims: int
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
        "vector": unit_vector(vector),
        "session_id": item.source.session_id,
        "turn_ids": list(item.source.turn_ids),
        "chunk_id": item.source.chunk_id,
        "event_time": item.event_time,
        "created_at": utc(created_at),
        "updated_at": utc(updated_at),
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
        created_at=utc(row["created_at"]) or utcnow(),
        updated_at=utc(row["updated_at"]) or utcnow(),
        grounding=row["grounding"] or [],
        emotion=row["emotion"],
        status=row["status"],
        meta=json.loads(row["meta"]) if row["meta"] else {},
    )


def stamps(rows: pa.Table, column: str = "updated_at") -> np.ndarray:
    """Return the rows' ``column`` timestamps as int64 microseconds (-1 for none)."""
    return rows.column(column).cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)


def one_per_key(rows: pa.Table, key: str = "pk", stamp: str = "updated_at") -> pa.Table:
    """Return ``rows`` with one row per ``key``: the one with the latest ``stamp`` (of equals, the later in the table).

    Tables written by older versions may hold several rows of one key (concurrent inserts);
    every read passes through here, so no caller ever sees two items for one key.
    """
    if rows.num_rows < 2 or key not in rows.column_names:
        return rows
    keys = rows.column(key)
    if pc.count_distinct(keys).as_py() == rows.num_rows:
        return rows
    times = stamps(rows, stamp) if stamp in rows.column_names else np.zeros(rows.num_rows, dtype=np.int64)
    order = np.lexsort((np.arange(rows.num_rows), times))
    winner: dict[Any, int] = {}
    for i, k in zip(order.tolist(), keys.take(pa.array(order)).to_pylist(), strict=True):
        winner[k] = i  # later (newer) rows overwrite earlier ones
    keep = sorted(winner.values())
    return rows.take(pa.array(keep, pa.int64()))


def vectors_of(rows: pa.Table, dims: int) -> np.ndarray:
    """Return the ``vector`` column of ``rows`` as a float32 matrix (one row per row)."""
    if rows.num_rows == 0:
        return np.zeros((0, dims), dtype=np.float32)
    flat = rows.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(rows.num_rows, dims)
