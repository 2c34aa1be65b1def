"""A refreshed snapshot holds exactly the rows and vectors a fresh load would, whatever changed in between."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dualmem.retrieval import snapshot as snapshots
from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import InMemoryDualStore, LanceDualStore
from dualmem.testing import HashEmbeddings

NS = ("p", "u")


def _item(i: int, round_: int):
    text = f"item {i} written in round {round_}"
    if i % 5 == 4:
        return Insight(id=f"k{i:03d}", namespace=NS, text=text, grounding=[f"k{i - 1:03d}"], source=SourceRef())
    return Fact(id=f"k{i:03d}", namespace=NS, text=text, source=SourceRef(session_id=f"s{i // 10}"))


def _same(a: snapshots.Snapshot, b: snapshots.Snapshot) -> None:
    assert a.ids == b.ids and a.rows.equals(b.rows)
    np.testing.assert_array_equal(a.vectors, b.vectors)
    assert a.vectors.dtype == b.vectors.dtype and a.vectors.flags["C_CONTIGUOUS"]


@pytest.mark.parametrize("backend", ["lancedb", "memory"])
def test_a_refreshed_snapshot_is_the_snapshot_a_load_gives(backend, tmp_path):
    emb = HashEmbeddings(32)
    store = LanceDualStore(str(tmp_path / "db"), emb) if backend == "lancedb" else InMemoryDualStore(emb)
    store.upsert([_item(i, 0) for i in range(0, 60, 2)])
    snap = snapshots.load(store, NS, store.version())
    rnd = random.Random(7)
    for round_ in range(1, 9):  # new keys between and around old ones, rewrites, retired and deleted rows
        present = [h.id for h in store.list(NS)]
        store.upsert([_item(i, round_) for i in rnd.sample(range(70), 6)])
        if present:
            store.supersede(NS, rnd.sample(present, 2))
            store.delete(NS, rnd.sample(present, 1))
        snap = snapshots.refresh(snap, store, store.version())
        _same(snap, snapshots.load(store, NS, store.version()))
    store.delete(NS, [h.id for h in store.list(NS)])  # everything gone
    _same(snapshots.refresh(snap, store, store.version()), snapshots.load(store, NS, store.version()))


class _StampsWithoutRows(InMemoryDualStore):
    """A backend written against the last release: its stamps scans have no ``row`` column."""

    def _apply(self, ops):
        return [
            r.drop_columns(["row"]) if getattr(r, "column_names", None) and "row" in r.column_names else r
            for r in super()._apply(ops)
        ]


def test_a_backend_whose_stamps_have_no_row_addresses_still_refreshes():
    store = _StampsWithoutRows(HashEmbeddings(32))
    store.upsert([_item(i, 0) for i in range(10)])
    snap = snapshots.load(store, NS, store.version())
    store.upsert([_item(3, 1), _item(20, 1)])
    _same(snapshots.refresh(snap, store, store.version()), snapshots.load(store, NS, store.version()))
