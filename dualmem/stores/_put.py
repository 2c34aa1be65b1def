"""The table rows of a put: what both backends store for :class:`~dualmem.stores.contract.PutItems`."""

from __future__ import annotations

from typing import Any

from dualmem.stores._rows import item_to_row
from dualmem.stores.contract import Namespace, PutItems, check_kind


def put_rows(op: PutItems, dims: int, now: Any) -> list[dict[str, Any]]:
    """Return the table rows of a prepared put (the last of two rows for one key wins; ``updated_at`` = ``now``
    unless the put keeps the items' times)."""
    assert op.vectors is not None
    rows: dict[tuple[Namespace, str], dict[str, Any]] = {}
    for item, vector in zip(op.items, op.vectors, strict=True):
        check_kind(item.kind)
        stamp = item.updated_at if op.keep_times else now
        rows[(tuple(item.namespace), item.id)] = item_to_row(
            item, vector, created_at=item.created_at, updated_at=stamp, dims=dims
        )
    return list(rows.values())
