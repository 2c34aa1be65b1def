"""The in-RAM namespace view follows other stores' commits: appends by the tail path, anything else by the general path.

Two ``DualStore`` objects on one folder have separate connections and views, as two
processes do (real LanceDB). Each case checks what the reader returns against what
the table holds, and which refresh path ran.
"""

from __future__ import annotations

import numpy as np
import pytest

import dualmem.stores._vcache as V
from dualmem.schema import Fact
from dualmem.stores import DualStore
from dualmem.testing import HashEmbeddings

NS, OTHER = ("coach", "ann"), ("coach", "bob")


def _fact(i: int, ns=NS, text: str | None = None) -> Fact:
    return Fact(id=f"f{i}", namespace=ns, text=text or f"fact {i} about the marathon plan")


@pytest.fixture
def pair(tmp_path):
    uri = str(tmp_path / "db")
    writer, reader = DualStore(uri, HashEmbeddings(32)), DualStore(uri, HashEmbeddings(32))
    writer.upsert([_fact(i) for i in range(5)] + [_fact(i, OTHER) for i in range(5)])
    assert len(reader.search_vectors(NS, [1.0] * 32, k=50)) == 5  # the reader holds a view now
    return writer, reader


@pytest.fixture
def paths(monkeypatch):
    """Count which refresh path each refresh took."""
    taken = {"tail": 0, "general": 0}
    real_appended, real_changed = V._appended_rows, V._changed

    def appended(*a, **k):
        out = real_appended(*a, **k)
        taken["tail"] += out is not None
        return out

    def changed(*a, **k):
        taken["general"] += 1
        return real_changed(*a, **k)

    monkeypatch.setattr(V, "_appended_rows", appended)
    monkeypatch.setattr(V, "_changed", changed)
    return taken


def _ids(store: DualStore, ns=NS) -> list[str]:
    return sorted(i for i, _ in store.search_vectors(ns, [1.0] * 32, k=1000))


def _truth(store: DualStore, ns=NS) -> list[str]:
    return sorted(i.id for i in store.list(ns))


def test_appends_reach_the_view_by_the_tail_path(pair, paths):
    writer, reader = pair
    for i in range(5, 9):  # several commits between two reads, both namespaces
        writer.upsert([_fact(i), _fact(i, OTHER)])
    assert _ids(reader) == _truth(writer) == sorted(f"f{i}" for i in range(9))
    assert _ids(reader, OTHER) == _truth(writer, OTHER)
    assert paths == {"tail": 1, "general": 0}  # NS's view refreshed once, without a namespace scan (OTHER: first read)
    writer.upsert([_fact(20, text="the newest fact")])
    vec = HashEmbeddings(32).embed_query("the newest fact")
    assert reader.search_vectors(NS, vec, k=1)[0][0] == "f20"  # the vector came with the row
    assert paths["general"] == 0


def test_a_delete_before_the_tail_goes_the_general_way_and_is_seen(pair, paths):
    writer, reader = pair
    writer.delete(NS, ["f1"])
    writer.upsert([_fact(6)])
    assert _ids(reader) == _truth(writer) == ["f0", "f2", "f3", "f4", "f6"]
    assert paths["general"] == 1 and paths["tail"] == 0
    writer.upsert([_fact(7)])  # the general path left a fresh tail: appends are cheap again
    assert _ids(reader) == _truth(writer)
    assert paths == {"tail": 1, "general": 1}


def test_updates_and_supersedes_replace_or_drop_rows(pair):
    writer, reader = pair
    writer.upsert([_fact(2, text="a rewritten fact about swimming")])
    writer.supersede(NS, ["f3"])
    writer.upsert([_fact(9)])
    assert _ids(reader) == _truth(writer) == ["f0", "f1", "f2", "f4", "f9"]
    vec = HashEmbeddings(32).embed_query("a rewritten fact about swimming")
    top, score = reader.search_vectors(NS, vec, k=1)[0]
    assert top == "f2" and score > 0.999  # the new vector, not the old one
    assert [i.text for i in reader.get(NS, ["f2"])] == ["a rewritten fact about swimming"]


def test_many_appends_past_the_cap_and_an_own_write_in_between(pair, paths):
    writer, reader = pair
    writer.upsert([_fact(i) for i in range(100, 700)])  # one commit, more rows than the tail path takes
    reader.upsert([_fact(999, text="written by the reader itself")])
    assert _ids(reader) == _truth(writer) and len(_ids(reader)) == 606
    writer.upsert([_fact(1000)])
    assert _ids(reader) == _truth(writer)


def test_over_read_rows_are_not_duplicated(pair):
    writer, reader = pair
    writer.upsert([_fact(5)])
    assert len(_ids(reader)) == 6
    snap = reader.snapshot(NS, "fact")
    assert snap is not None and len(snap.rows) == len(set(snap.rows.column("id").to_pylist())) == snap.vectors.shape[0]
    assert np.allclose(np.linalg.norm(snap.vectors, axis=1), 1.0, atol=1e-3)


def test_tail_is_dropped_when_a_commit_races_its_read(tmp_path, monkeypatch):
    uri = str(tmp_path / "db")
    writer = DualStore(uri, HashEmbeddings(32))
    writer.upsert([_fact(0)])
    table = writer._tables["fact"]
    real = table.count_rows

    def count_then_commit(*a, **k):  # another process commits between the count and the last-row read
        n = real(*a, **k)
        DualStore(uri, HashEmbeddings(32)).upsert([_fact(len(a) + 50)])
        return n

    monkeypatch.setattr(table, "count_rows", count_then_commit)
    assert V.read_tail(table) is None


def _random_vectors(n: int, dims: int = 32, seed: int = 0) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, dims)) * rng.uniform(0.2, 5.0, (n, 1))).tolist()  # norms far from 1


def test_lancedb_scan_ranks_and_scores_like_the_view(tmp_path):
    uri = str(tmp_path / "db")
    view, scan = DualStore(uri, HashEmbeddings(32)), DualStore(uri, HashEmbeddings(32), flat_search_max_rows=0)
    view.upsert([_fact(i) for i in range(200)], vectors=_random_vectors(200))
    for q in _random_vectors(10, seed=1):
        a, b = view.search_vectors(NS, q, k=10), scan.search_vectors(NS, q, k=10)
        assert {i for i, _ in a} == {i for i, _ in b}
        assert np.allclose([s for _, s in a], [s for _, s in b], atol=2e-3)  # cosine, up to float16 rounding
        # the same order, but for near ties (float16 rounding may swap items whose scores differ by < 1e-3)
        assert all(x == y or abs(sx - sy) < 1e-3 for (x, sx), (y, sy) in zip(a, b, strict=True))


def test_a_table_without_the_unit_mark_is_searched_by_cosine(tmp_path):
    import lancedb
    import pyarrow as pa

    from dualmem.schema import utcnow
    from dualmem.stores._rows import item_schema, item_to_row

    uri = str(tmp_path / "db")
    schema = item_schema(2).remove_metadata()  # a table written by a version that stored vectors as given
    table = lancedb.connect(uri).create_table("facts", schema=schema)
    rows = [item_to_row(_fact(i), [1.0, 0.0], created_at=utcnow(), updated_at=utcnow(), dims=2) for i in range(2)]
    rows[0]["vector"], rows[1]["vector"] = [0.5, 0.0], [30.0, 26.0]  # cosine from (1, 0): 1.0 and 0.76
    rows.append(item_to_row(_fact(2), [1.0, 0.0], created_at=utcnow(), updated_at=utcnow(), dims=2))
    rows[2]["vector"] = [40.0, 1.0]  # cosine 0.9997: second; L2 from (1, 0): last
    table.add(pa.Table.from_pylist(rows, schema=schema))
    store = DualStore(uri, HashEmbeddings(2), dims=2, flat_search_max_rows=0)
    assert [i for i, _ in store.search_vectors(NS, [1.0, 0.0], k=3)] == ["f0", "f2", "f1"]


def test_grounding_reads_active_facts_from_the_view_and_the_rest_from_the_table(pair, monkeypatch):
    from dualmem.schema import Insight

    writer, reader = pair
    writer.supersede(NS, ["f1"])
    insight = Insight(id="i1", namespace=NS, text="training shapes the week", grounding=["f0", "f1", "f404"])
    scans = []
    import dualmem.stores._lance as L

    real = L.query_rows
    monkeypatch.setattr(L, "query_rows", lambda table, where, *a, **k: scans.append(where) or real(table, where, *a, **k))
    cited = reader.grounding(NS, [insight])["i1"]
    assert [(f.id, f.status) for f in cited] == [("f0", "active"), ("f1", "superseded")]  # f404 does not exist
    assert len(scans) == 1 and "f0" not in scans[0] and "f1" in scans[0]  # only what the view does not hold


def test_list_count_and_get_read_a_held_view_like_the_table(pair):
    from dualmem.schema import Insight

    writer, reader = pair
    writer.upsert([Insight(id="i1", namespace=NS, text="an insight", grounding=["f0"]), _fact(7)])
    writer.supersede(NS, ["f2"])
    reader.search_vectors(NS, [1.0] * 32, k=1, kind="insight")  # the reader now holds both views of NS
    cold = DualStore(writer.uri, HashEmbeddings(32))  # holds nothing: reads the table
    for kwargs in ({}, {"kind": "fact"}, {"limit": 3}, {"newest_first": False, "limit": 2}, {"status": None}):
        assert [i.id for i in reader.list(NS, **kwargs)] == [i.id for i in cold.list(NS, **kwargs)], kwargs
    assert reader.count(NS) == cold.count(NS) == 6 and reader.count(NS, kind="insight") == 1
    assert [i.id for i in reader.get(NS, ["i1", "f2", "f7", "nope"])] == ["i1", "f2", "f7"]
    assert reader.get(NS, ["f2"])[0].status == "superseded"
