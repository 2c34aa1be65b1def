"""Writing keeps the LanceDB backend tidy: two commits per chunk, and files and versions bounded as memory grows.

Real LanceDB folders, the real writer (``write_history``) with a scripted model and, in one test, a reader in another
process searching all the while.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from conftest import REPO

from dualmem.schema import Persona, Session, Turn
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer import write_history

PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist")
NS = ("dr-lee", "user")
READER = """
import sys, time, json
from dualmem.stores import LanceDualStore
from dualmem.testing import HashEmbeddings
store = LanceDualStore(sys.argv[1], HashEmbeddings(64))
reads = errors = 0
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        store.search(("dr-lee", "user"), "topic detail", k=5)
        store.list(("dr-lee", "user"), kind="fact")
        reads += 1
    except Exception as exc:
        errors += 1
        print(repr(exc), file=sys.stderr)
print(json.dumps({"reads": reads, "errors": errors}))
"""


def _sessions(n: int) -> list[Session]:
    return [
        Session(
            id=f"s{s}",
            time="2024-01-01",
            turns=[Turn(id=f"s{s}t0", role="user", text=f"topic{s} detail{s} happened today")],
        )
        for s in range(n)
    ]


def _answer(messages, tool=None):
    turn = str(messages[1].content).split("] User:", 1)[0].rsplit("[", 1)[-1]
    return {
        "facts": [
            {
                "op": "ADD",
                "id": "N1",
                "text": f"the user mentioned {turn} " + " ".join(f"w{turn}{i}" for i in range(4)),
                "turn_ids": [turn],
            }
        ],
        "insights": [{"op": "ADD", "id": "M1", "text": f"I sense {turn} matters", "fact_ids": ["N1"]}],
    }


def _write(store: LanceDualStore, tmp_settings, sessions: list[Session]) -> int:
    """Write the sessions (a chunk each); return how many chunks were applied now."""
    model = FakeChatModel(responses=[_answer], cycle=True)
    report = write_history(
        sessions, PERSONA, settings=tmp_settings.replace(chunk_tokens=20), model=model, store=store, progress=False
    )
    return sum(r["status"] == "applied" for r in report.chunks)


def _files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def test_a_history_costs_two_commits_per_chunk(tmp_path, tmp_settings):
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store.tidy_every = 0  # count the writer's own commits
    before = {t: store._db.open_table(t).version for t in ("memory", "chunk_ledger")}
    assert _write(store, tmp_settings, _sessions(30)) == 30
    assert len(store.ledger.applied_ids(NS)) == 30
    assert store.ledger.look(NS, "")[1] == []  # the last chunks were marked applied when the hold ended
    commits = sum(store._db.open_table(t).version - v for t, v in before.items())
    assert commits == 30 * 2 + 1  # a ledger commit and a memory commit per chunk, one mark at the end


def test_files_and_versions_stay_bounded_as_memory_grows(tmp_path, tmp_settings):
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store.tidy_every, store.tidy_keep = 10, timedelta(0)  # no grace window: what is kept depends on history alone
    counts = []
    for end in range(10, 90, 10):
        _write(store, tmp_settings, _sessions(end))
        counts.append((_files(tmp_path / "db"), len(store.table.list_versions())))
    assert len(store.ledger.applied_ids(NS)) == 80
    files, versions = zip(*counts, strict=True)
    assert max(versions) <= store.tidy_every, versions  # those since the last tidy (80 chunks untidied keep 88)
    assert max(files) < 2 * min(files), f"files grow with the history: {files}"  # they rise and fall with the cadence

    untidy = LanceDualStore(str(tmp_path / "untidy"), HashEmbeddings(64))
    untidy.tidy_every = 0
    _write(untidy, tmp_settings, _sessions(80))
    assert _files(tmp_path / "untidy") > 4 * max(files)  # what the cadence saves


def test_a_reader_in_another_process_never_fails_while_tidies_drop_versions(tmp_path, tmp_settings):
    uri = str(tmp_path / "db")
    store = LanceDualStore(uri, HashEmbeddings(64))
    store.tidy_every, store.tidy_keep = 10, timedelta(seconds=1)
    reader = subprocess.Popen([sys.executable, "-c", READER, uri, "15"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"  # it reads while the writer writes
    _write(store, tmp_settings, _sessions(20))
    first = store.version()
    _write(store, tmp_settings, _sessions(80))
    out, _ = reader.communicate(timeout=120)
    seen = json.loads(out)
    assert seen["errors"] == 0 and seen["reads"] > 0
    assert len(store.ledger.applied_ids(NS)) == 80
    kept = [v["version"] for v in store.table.list_versions()]
    assert min(kept) > first, kept  # the first 20 chunks' versions are older than a second by now, and dropped


def test_many_short_lived_writers_tidy_as_one_long_one(tmp_path, tmp_settings, monkeypatch):
    import dualmem.stores._lance as L

    monkeypatch.setattr(L, "TIDY_EVERY", 10)
    monkeypatch.setattr(L, "TIDY_KEEP", timedelta(0))
    uri = str(tmp_path / "db")
    for n in range(15):  # a fresh store object per short history, as batch ingest opens one per history
        store = LanceDualStore(uri, HashEmbeddings(64))
        persona = PERSONA.model_copy(update={"id": f"p{n}"})
        write_history(
            _sessions(2),
            persona,
            settings=tmp_settings.replace(chunk_tokens=20),
            store=store,
            model=FakeChatModel(responses=[_answer], cycle=True),
            progress=False,
        )
    store = LanceDualStore(uri, HashEmbeddings(64))
    assert store.table.version > 30  # 30 chunks written
    assert len(store.table.list_versions()) < 12  # tidied on the way, though no writer made 10 commits itself
