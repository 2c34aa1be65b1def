"""Every ADD / UPDATE / DELETE of an item is kept (writer, LangGraph store API, memory tools) and read back in order;
retrieval sees only current items."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dualmem.cli import app
from dualmem.control.history import item_history
from dualmem.errors import ConfigurationError
from dualmem.retrieval import Ranker, create_manage_memory_tool
from dualmem.schema import Persona
from dualmem.stores import InMemoryDualStore, LanceDualStore, langgraph_view
from dualmem.testing import FakeChatModel, HashEmbeddings, editing_writer, synthetic_history
from dualmem.writer import write_history

NS = ("mara", "theo")
PERSONA = Persona(id="mara", name="Mara")


@pytest.fixture(params=["lancedb", "memory"])
def written(request, tmp_path, tmp_settings):
    """A namespace written by a writer that adds, updates and deletes (12 sessions)."""
    emb = HashEmbeddings(64)
    dual = LanceDualStore(str(tmp_path / "db"), emb) if request.param == "lancedb" else InMemoryDualStore(emb)
    model = FakeChatModel(responses=[editing_writer], cycle=True)
    write_history(
        synthetic_history(12, 4), PERSONA, settings=tmp_settings, model=model, store=dual, namespace=NS, progress=False
    )
    return dual


def _versions(dual):
    return [i for i in dual.list(NS, status="superseded") if i.meta.get("version_of")]


def test_an_updated_items_history_chains_every_state_in_order(written):
    dual = written
    updated = {v.meta["version_of"] for v in _versions(dual)}
    assert updated, "the editing writer updates items"
    chunks = dual.ledger.applied_ids(NS)
    for item_id in updated:
        records = item_history(dual, NS, item_id)
        current = dual.get(NS, [item_id])[0]
        assert (
            records[0]["op"] == "ADD"
            and records[0]["chunk_id"] == current.source.chunk_id
            and records[0]["via"] == "writer"
        )
        assert [r["op"] for r in records[1:]] == ["UPDATE"] * (len(records) - 1 - (records[-1]["op"] == "DELETE")) + (
            ["DELETE"] if records[-1]["op"] == "DELETE" else []
        )
        for before, after in zip(records, records[1:], strict=False):
            assert after["text_before"] == before["text_after"], "each change starts from the state the last one left"
            assert after["at"] >= before["at"] and after["chunk_id"] in chunks
        last = records[-1]
        assert (last["text_after"] if last["op"] != "DELETE" else last["text_before"]) == current.text


def test_a_writer_delete_ends_the_history_and_retrieval_sees_only_current_items(written):
    dual = written
    deleted = [
        i for i in dual.list(NS, status="superseded") if i.meta.get("deleted_by_chunk") and not i.meta.get("version_of")
    ]
    assert deleted, "the editing writer deletes insights"
    records = item_history(dual, NS, deleted[0].id)
    assert records[-1]["op"] == "DELETE" and records[-1]["chunk_id"] == deleted[0].meta["deleted_by_chunk"]
    assert records[-1]["text_after"] is None
    hidden = {i.id for i in dual.list(NS, status="superseded")}
    for query in ("amber birch", "updated fact", "revised insight", "kelp lagoon"):
        for hit in Ranker("hybrid").rank(dual, NS, query, 50) + Ranker().rank(dual, NS, query, 50):
            assert hit.item.id not in hidden and hit.item.status == "active"


def test_writes_through_the_langgraph_store_api_and_the_tools_keep_history(tmp_path):
    dual = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store = langgraph_view(dual)
    ns = ("dualmem", *NS, "fact")
    store.put(ns, "f1", {"text": "keeps bees on the roof"})
    store.put(ns, "f1", {"text": "keeps bees in the garden"})
    store.put(ns, "f1", {"text": "keeps bees in the garden"})  # no change, no version
    store.delete(ns, "f1")
    records = item_history(dual, NS, "f1")
    assert [(r["op"], r["via"]) for r in records] == [("ADD", "api"), ("UPDATE", "api"), ("DELETE", "api")]
    assert [r["text_after"] for r in records] == ["keeps bees on the roof", "keeps bees in the garden", None]
    assert store.get(ns, "f1") is None and dual.search(NS, "bees garden", mode="fts") == []

    manage = create_manage_memory_tool(NS, store=dual)
    key = manage.invoke({"content": "runs on tuesdays"}).split()[-1]
    manage.invoke({"action": "update", "id": key, "content": "runs on thursdays"})
    records = item_history(dual, NS, key)
    assert [r["op"] for r in records] == ["ADD", "UPDATE"] and records[1]["change"].startswith("api:manage_memory:")
    assert [h.item.text for h in dual.search(NS, "runs", mode="fts")] == ["runs on thursdays"]


def test_history_of_an_unknown_item_names_the_fix(written):
    with pytest.raises(ConfigurationError, match="--all"):
        item_history(written, NS, "no-such-id")
    version = _versions(written)[0]
    with pytest.raises(ConfigurationError, match="version row"):
        item_history(written, NS, version.id)


def test_dualmem_inspect_history_prints_the_changes(tmp_path, monkeypatch, tmp_settings):
    from dualmem.stores.personas import save_persona

    uri = str(tmp_path / "db")
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:64")
    monkeypatch.setenv("DUALMEM_STORE_URI", uri)
    dual = LanceDualStore(uri, HashEmbeddings(64))
    save_persona(uri, PERSONA)
    langgraph_view(dual).put(("dualmem", *NS, "fact"), "f1", {"text": "likes sailing"})
    langgraph_view(dual).put(("dualmem", *NS, "fact"), "f1", {"text": "likes sailing at dawn"})
    result = CliRunner().invoke(app, ["inspect", "-p", "mara", "-u", "theo", "--history", "f1"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "ADD" in result.stdout and "UPDATE" in result.stdout and "likes sailing at dawn" in result.stdout
    bad = CliRunner().invoke(app, ["inspect", "-p", "mara", "-u", "theo", "--history", "nope"], terminal_width=200)
    assert bad.exit_code == 2 and "--all" in bad.stderr and "Traceback" not in bad.output
    assert json.loads(json.dumps(item_history(dual, NS, "f1")))[1]["text_before"] == "likes sailing"
