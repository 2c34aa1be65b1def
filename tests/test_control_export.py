"""Export → import into a fresh store (local, or the S3-compatible server) → the same retrieval; history in order;
a malformed file is one error naming the file and the field, before anything is written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dualmem.cli import app
from dualmem.control.export import export_namespace, import_archive, read_export
from dualmem.errors import DatasetError
from dualmem.retrieval import Ranker
from dualmem.schema import Persona
from dualmem.stores import LanceDualStore, langgraph_view
from dualmem.testing import FakeChatModel, HashEmbeddings, editing_writer, synthetic_history
from dualmem.writer import write_history

NS = ("mara", "theo")
QUERIES = [
    "amber birch",
    "cobalt denim",
    "ember fjord",
    "garnet harbor",
    "indigo juniper",
    "kelp lagoon",
    "maple nutmeg",
    "opal amber",
    "updated fact",
    "revised insight",
    "I read this as a sign",
    "the user said",
    "thinking today",
    "birch cobalt denim",
    "harbor indigo",
    "juniper kelp",
    "nutmeg opal birch",
    "fjord garnet",
    "lagoon maple",
    "denim ember",
]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A store where theo's memory was written, updated and deleted by a writer, and changed through the store API."""
    root = tmp_path_factory.mktemp("source")
    from dualmem.config import Settings

    settings = Settings(store_uri=str(root / "db"), checkpoint_path=str(root / "ck.sqlite"), embedder="hash:64")
    dual = LanceDualStore(settings.store_uri, HashEmbeddings(64))
    model = FakeChatModel(responses=[editing_writer], cycle=True)
    for user in ("theo", "ines"):
        write_history(
            synthetic_history(14, 4),
            Persona(id="mara", name="Mara"),
            settings=settings,
            model=model,
            store=dual,
            namespace=("mara", user),
            progress=False,
        )
    lg = langgraph_view(dual)
    lg.put(("dualmem", *NS, "fact"), "api-1", {"text": "moved to Lisbon"})
    lg.put(("dualmem", *NS, "fact"), "api-1", {"text": "moved to Porto"})
    lg.put(("dualmem", *NS, "fact"), "api-2", {"text": "sold the car"})
    lg.delete(("dualmem", *NS, "fact"), "api-2")
    return dual


def ranked(dual, ns=NS):
    ranker = Ranker()
    return [[(h.item.id, round(h.score, 6), h.item.text) for h in ranker.rank(dual, ns, q, 8)] for q in QUERIES]


@pytest.fixture(params=["local", "s3"])
def target_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "target"), None
    s3 = request.getfixturevalue("s3_server")
    return f"s3://{s3['bucket']}/import-{tmp_path.name}", s3["options"]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_export_then_import_gives_the_same_retrieval_and_history(source, target_uri, tmp_path, suffix):
    out = tmp_path / f"theo{suffix}"
    counts = export_namespace(source, NS, out)
    assert counts["items"] == source.count(NS, status=None) - counts["versions"] and counts["versions"] > 0
    uri, options = target_uri
    target = LanceDualStore(uri, HashEmbeddings(64), storage_options=options)
    import_archive(read_export(out), target)
    assert ranked(target) == ranked(source) and any(ranked(source))
    again = tmp_path / f"again{suffix}"
    export_namespace(target, NS, again)
    first, second = read_export(out), read_export(again)
    assert [(i.model_dump(), v) for i, v in first.items] == [(i.model_dump(), v) for i, v in second.items]
    assert sorted(first.ledger, key=str) == sorted(second.ledger, key=str)
    assert target.ledger.applied_ids(NS) == source.ledger.applied_ids(NS), "a resumed writer skips what was written"


def test_an_exported_item_shows_its_history_in_order(source, tmp_path):
    out = tmp_path / "theo.json"
    export_namespace(source, NS, out)
    doc = json.loads(out.read_text())
    assert (
        doc["format"] == "dualmem.export"
        and doc["namespace"] == {"persona": "mara", "user": "theo"}
        and doc["dims"] == 64
    )
    moved = next(i for i in doc["items"] if i["id"] == "api-1")
    assert [(h["op"], h["text_after"]) for h in moved["history"]] == [
        ("ADD", "moved to Lisbon"),
        ("UPDATE", "moved to Porto"),
    ]
    updated = [i for i in doc["items"] if len(i["history"]) > 2]
    assert updated, "the writer updated some item twice"
    for item in updated:
        ops = [h["op"] for h in item["history"]]
        assert ops[0] == "ADD" and set(ops[1:]) <= {"UPDATE", "DELETE"}
        assert all(
            b["text_after"] == a["text_before"] for b, a in zip(item["history"], item["history"][1:], strict=False)
        )
        assert [h["at"] for h in item["history"]] == sorted(h["at"] for h in item["history"])
        assert item["source"]["chunk_id"] and item["source"]["session_id"] and item["source"]["turn_ids"]
    assert all(i["grounding"] for i in doc["items"] if i["kind"] == "insight")
    sold = next(d for d in doc["deleted"] if d["id"] == "api-2")
    assert [h["op"] for h in sold["history"]] == ["ADD", "DELETE"]


def _broken(tmp_path, source, change):
    out = tmp_path / "theo.json"
    export_namespace(source, NS, out)
    doc = json.loads(out.read_text())
    change(doc)
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["items"][3].update(kind="memo"), "$.items[3].kind"),
        (lambda d: d["items"][0].update(vector=[0.1, 0.2]), "$.items[0].vector"),
        (lambda d: d.update(format="something else"), "$.format"),
        (lambda d: d["items"][1].pop("text"), "$.items[1].text"),
        (lambda d: d["ledger"].append({"unit": 3}), "$.ledger["),
    ],
)
def test_a_malformed_export_is_refused_before_anything_is_written(source, tmp_path, change, field):
    out = _broken(tmp_path, source, change)
    with pytest.raises(DatasetError) as err:
        read_export(out)
    assert str(out) in str(err.value) and field in str(err.value)
    result = CliRunner().invoke(
        app, ["import", str(out), "--store", str(tmp_path / "fresh")], env={"DUALMEM_EMBEDDER": "hash:64"}
    )
    assert result.exit_code == 2 and field in result.stderr and "Traceback" not in result.output
    assert LanceDualStore(str(tmp_path / "fresh"), HashEmbeddings(64)).count(NS, status=None) == 0


def test_the_commands_export_and_import_and_refuse_what_would_mix(source, tmp_path, monkeypatch):
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:64")
    out, fresh = tmp_path / "theo.jsonl", str(tmp_path / "fresh")
    done = CliRunner().invoke(app, ["export", "-p", "mara", "-u", "theo", "-o", str(out), "--store", source.uri])
    assert done.exit_code == 0 and out.read_text().count("\n") > 10, done.output
    done = CliRunner().invoke(app, ["import", str(out), "--store", fresh, "--user", "theo2"])
    assert done.exit_code == 0, done.output
    target = LanceDualStore(fresh, HashEmbeddings(64))
    assert ranked(target, ("mara", "theo2")) == ranked(source)
    again = CliRunner().invoke(app, ["import", str(out), "--store", fresh, "--user", "theo2"])
    assert again.exit_code == 2 and "--merge" in again.stderr
    assert CliRunner().invoke(app, ["import", str(out), "--store", fresh, "--user", "theo2", "--merge"]).exit_code == 0
    other = CliRunner().invoke(
        app, ["import", str(out), "--store", str(tmp_path / "other")], env={"DUALMEM_EMBEDDER": "hash:32"}
    )
    assert other.exit_code == 2 and "--reembed" in other.stderr and "DUALMEM_EMBEDDER=hash:64" in other.stderr
    missing = CliRunner().invoke(
        app, ["export", "-p", "mara", "-u", "nobody", "-o", str(tmp_path / "x.json"), "--store", source.uri]
    )
    assert missing.exit_code == 2 and "--user" in missing.stderr and not (tmp_path / "x.json").exists()
