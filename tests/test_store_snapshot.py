"""DualStore.snapshot: a namespace's rows and unit vectors from the RAM view, fresh, scoped and filtered (real LanceDB)."""

from __future__ import annotations

import numpy as np

from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import DualStore
from dualmem.testing import HashEmbeddings

NS = ("coach", "user")


def _facts(ns=NS, sessions=("s1", "s1", "s2")):
    return [Fact(id=f"f{i}", namespace=ns, text=f"fact number {i} about running", source=SourceRef(session_id=s))
            for i, s in enumerate(sessions)]


def test_snapshot_holds_the_namespace_active_rows_with_unit_vectors(tmp_path):
    store = DualStore(str(tmp_path / "db"), HashEmbeddings(32))
    store.upsert([*_facts(), *_facts(ns=("coach", "other")), Insight(id="i1", namespace=NS, text="an insight", grounding=["f0"])])
    store.supersede(NS, ["f1"])
    snap = store.snapshot(NS, "fact")
    assert snap is not None and snap.kind == "fact"
    assert sorted(snap.rows.column("id").to_pylist()) == ["f0", "f2"]  # superseded and other namespaces left out
    assert snap.vectors.shape == (2, 32) and np.allclose(np.linalg.norm(snap.vectors, axis=1), 1.0, atol=1e-3)
    expected = np.asarray(HashEmbeddings(32).embed_documents(["fact number 0 about running"])[0])
    row = snap.rows.column("id").to_pylist().index("f0")
    assert float(snap.vectors[row] @ expected / np.linalg.norm(expected)) > 0.999
    assert snap.allowed is None
    assert store.snapshot(NS, "insight").rows.column("id").to_pylist() == ["i1"]  # type: ignore[union-attr]


def test_filter_marks_allowed_rows(tmp_path):
    store = DualStore(str(tmp_path / "db"), HashEmbeddings(32))
    store.upsert(_facts())
    snap = store.snapshot(NS, "fact", filter={"session_id": {"$in": ["s2"]}})
    assert snap is not None and snap.allowed is not None
    assert [i for i, ok in zip(snap.rows.column("id").to_pylist(), snap.allowed, strict=True) if ok] == ["f2"]


def test_snapshot_is_fresh_across_stores_and_derived_data_follows_the_version(tmp_path):
    uri = str(tmp_path / "db")
    reader, writer = DualStore(uri, HashEmbeddings(32)), DualStore(uri, HashEmbeddings(32))
    writer.upsert(_facts())
    first = reader.snapshot(NS, "fact")
    assert first is not None
    first.derived["index"] = "built once"
    again = reader.snapshot(NS, "fact")
    assert again is not None and again.derived.get("index") == "built once"  # unchanged namespace: kept
    writer.upsert([Fact(id="f9", namespace=NS, text="a new fact from another writer")])
    fresh = reader.snapshot(NS, "fact")
    assert fresh is not None and "f9" in fresh.rows.column("id").to_pylist()
    assert fresh.version > first.version and "index" not in fresh.derived  # another version: computed anew


def test_namespace_over_the_ram_limit_has_no_snapshot(tmp_path):
    store = DualStore(str(tmp_path / "db"), HashEmbeddings(32), flat_search_max_rows=2)
    store.upsert(_facts())
    assert store.snapshot(NS, "fact") is None
