"""A storage format with notice: a store written by the earlier layout (format 1: separate facts and insights tables,
tests/fixtures/stores/format1, written by that release) is refused in one line naming `dualmem migrate`, never a
traceback; `dualmem migrate` (dry run, backup) moves it with nothing lost; a store written by this release
(tests/fixtures/stores/format2) opens — every later change must keep opening it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from dualmem.stores import LanceDualStore
from dualmem.testing import HashEmbeddings

FIXTURES = REPO / "tests" / "fixtures" / "stores"
NS = ("mara-okafor", "theo")


def cli(*args: str, cwd: Path, store: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DUALMEM_EMBEDDER": "hash:64", "DUALMEM_STORE_URI": str(store), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "dualmem.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_format_1_store_is_refused_in_one_line_then_migrated_with_nothing_lost(tmp_path):
    store = tmp_path / "db"
    shutil.copytree(FIXTURES / "format1", store)
    for command in (
        ("inspect", "--persona", "mara-okafor"),
        ("ask", "night shifts", "--persona", "mara-okafor", "--model", "fake:memory"),
    ):
        done = cli(*command, cwd=tmp_path, store=store)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "dualmem migrate" in done.stderr and "Traceback" not in done.stderr

    files = sorted(p.relative_to(store) for p in store.rglob("*"))
    dry = cli("migrate", "--dry-run", cwd=tmp_path, store=store)
    assert dry.returncode == 0 and "would" in dry.stdout and "4 facts" in dry.stdout, dry.stdout + dry.stderr
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == files, "a dry run changes nothing"

    done = cli("migrate", cwd=tmp_path, store=store)
    assert done.returncode == 0, done.stderr
    backups = list(tmp_path.glob("db.backup-*"))
    assert len(backups) == 1 and (backups[0] / "facts.lance").is_dir(), "the old store is kept beside it"
    dual = LanceDualStore(str(store), HashEmbeddings(64))
    assert dual.count(NS, "fact") == 4 and dual.count(NS, "insight") == 4
    facts = {f.id for f in dual.list(NS, "fact")}
    assert all(set(i.grounding) <= facts for i in dual.list(NS, "insight"))
    shown = cli("inspect", "--persona", "mara-okafor", cwd=tmp_path, store=store)
    assert shown.returncode == 0 and "insight" in shown.stdout
    again = cli(
        "ingest",
        str(REPO / "dualmem" / "data" / "sample_dialogue.json"),
        "--model",
        "fake:memory",
        cwd=tmp_path,
        store=store,
    )
    assert again.returncode == 0 and "written before" in again.stdout + again.stderr, "the ledger came along"
    assert dual.count(NS, "fact") == 4
    assert "nothing to migrate" in cli("migrate", cwd=tmp_path, store=store).stdout


def test_a_store_written_by_this_release_opens(tmp_path):
    store = tmp_path / "db"
    shutil.copytree(FIXTURES / "format2", store)
    dual = LanceDualStore(str(store), HashEmbeddings(64))
    assert dual.count(NS, "fact") == 4 and dual.count(NS, "insight") == 4
    listed = cli("inspect", "--persona", "mara-okafor", cwd=tmp_path, store=store)
    assert listed.returncode == 0 and "fact" in listed.stdout, listed.stderr
    assert json.loads(json.dumps([i.id for i in dual.list(NS)]))
