"""Data safety on the control paths: import is all-or-nothing and validated like the writer's output, forget finds the
checkpoint file or says it cannot, ids never escape a folder and wildcards are literal, every command checks its input
before it writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from dualmem.config import Settings
from dualmem.schema import Fact, Insight
from dualmem.stores import LanceDualStore
from dualmem.testing import HashEmbeddings

NS = ("mara", "theo")


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full = {**os.environ, "DUALMEM_EMBEDDER": "hash:64", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dualmem.cli", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout
    )


def export_file(tmp_path: Path, n: int = 1001) -> dict:
    """Return an export (JSON document) of ``n`` facts and one grounded insight, written by `dualmem export`."""
    dual = LanceDualStore(str(tmp_path / "src"), HashEmbeddings(64))
    facts = [Fact(id=f"f{i}", namespace=NS, text=f"fact number {i} about the garden") for i in range(n - 1)]
    dual.upsert([*facts, Insight(id="i0", namespace=NS, text="calm in routine", grounding=["f0", "f1"])])
    done = cli(
        "export",
        "--persona",
        "mara",
        "--user",
        "theo",
        "--out",
        str(tmp_path / "x.json"),
        cwd=tmp_path,
        env={"DUALMEM_STORE_URI": str(tmp_path / "src")},
    )
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "x.json").read_text())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    """One export of 1,001 items (JSON text), made once for the module: each test spoils its own copy."""
    return json.dumps(export_file(tmp_path_factory.mktemp("export")))


@pytest.mark.parametrize(
    "spoil, field",
    [
        (lambda d: d["items"][500]["vector"].__setitem__(3, float("nan")), "vector"),
        (lambda d: d["items"][7].__setitem__("id", "bad\x00id"), "id"),
        (lambda d: d["items"][7].__setitem__("id", ""), "id"),
        (lambda d: d["items"][7].__setitem__("id", "../../escape"), "id"),
        (lambda d: d["items"][7].__setitem__("text", "x" * 20_000_000), "text"),
        (
            lambda d: next(i for i in d["items"] if i["kind"] == "insight").__setitem__("grounding", ["nope"]),
            "grounding",
        ),
        (lambda d: d["items"][7].__setitem__("kind", "opinion"), "kind"),
    ],
    ids=["nan-vector", "nul-id", "empty-id", "path-id", "20mb-text", "ungrounded", "unknown-kind"],
)
def test_one_bad_record_refuses_the_whole_import_in_one_line(tmp_path, exported, spoil, field):
    data = json.loads(exported)
    spoil(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    target = {"DUALMEM_STORE_URI": str(tmp_path / "dst")}
    done = cli("import", str(tmp_path / "bad.json"), cwd=tmp_path, env=target)
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert len(done.stderr.strip().splitlines()) == 1 and field in done.stderr and "bad.json" in done.stderr
    assert not (tmp_path / "dst").exists() or LanceDualStore(str(tmp_path / "dst"), HashEmbeddings(64)).count(NS) == 0


def test_an_import_is_whole_or_absent_and_a_rerun_works(tmp_path, exported):
    (tmp_path / "good.json").write_text(exported)
    target = {"DUALMEM_STORE_URI": str(tmp_path / "dst")}
    seen = set()
    for delay in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):  # killed at several points: the namespace is empty or whole
        proc = subprocess.Popen(
            [sys.executable, "-m", "dualmem.cli", "import", str(tmp_path / "good.json")],
            cwd=tmp_path,
            env={**os.environ, "DUALMEM_EMBEDDER": "hash:64", **target},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (tmp_path / "dst").exists():
            held = LanceDualStore(str(tmp_path / "dst"), HashEmbeddings(64)).count(NS, status=None)
            assert held in (0, 1001), f"killed after {delay} s: {held} rows"
            seen.add(held)
            if held:
                break
    if 1001 not in seen:
        done = cli("import", str(tmp_path / "good.json"), cwd=tmp_path, env=target)
        assert done.returncode == 0, done.stderr
    assert LanceDualStore(str(tmp_path / "dst"), HashEmbeddings(64)).count(NS, status=None) == 1001


def _chatted(home: Path, store: str) -> LanceDualStore:
    """A user with memory and a chat thread whose checkpoint is in ``home/.dualmem/checkpoints.sqlite``."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from dualmem.chat.pending import PendingThread, new_turn
    from dualmem.stores import LanceDBStore

    dual = LanceDualStore(store, HashEmbeddings(64))
    dual.upsert([Fact(id="f1", namespace=NS, text="grows tomatoes")])
    PendingThread(LanceDBStore(store, dual=dual), NS, "chat-1").append([new_turn("t-1", "user", "hello", seq=1)], {})
    (home / ".dualmem").mkdir(parents=True, exist_ok=True)
    with SqliteSaver.from_conn_string(str(home / ".dualmem" / "checkpoints.sqlite")) as saver:
        saver.put(
            {"configurable": {"thread_id": "chat-1", "checkpoint_ns": ""}},
            {
                "v": 1,
                "id": "c1",
                "ts": "2024-01-01T00:00:00+00:00",
                "channel_values": {},
                "channel_versions": {},
                "versions_seen": {},
            },
            {},
            {},
        )
    return dual


def _threads(home: Path) -> list:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(home / ".dualmem" / "checkpoints.sqlite")) as saver:
        return list(saver.list({"configurable": {"thread_id": "chat-1"}}))


def test_forget_from_another_folder_finds_the_checkpoints_or_fails_in_one_line(tmp_path):
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir(parents=True)
    # the default layout: .dualmem/lancedb beside .dualmem/checkpoints.sqlite — found from anywhere with --store
    dual = _chatted(home, str(home / ".dualmem" / "lancedb"))
    done = cli(
        "forget",
        "--persona",
        "mara",
        "--user",
        "theo",
        "--yes",
        "--store",
        str(home / ".dualmem" / "lancedb"),
        cwd=elsewhere,
    )
    assert done.returncode == 0, done.stderr
    assert dual.count(NS) == 0 and _threads(home) == [], "the checkpoints went too"
    # a store elsewhere: the default checkpoint file is neither here nor beside the store: one line, nothing forgotten
    other = tmp_path / "other"
    dual = _chatted(other, str(other / "store"))
    done = cli("forget", "--persona", "mara", "--user", "theo", "--yes", "--store", str(other / "store"), cwd=elsewhere)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "checkpoint file" in done.stderr and "--checkpoints" in done.stderr
    assert dual.count(NS) == 1 and _threads(other), "nothing was forgotten"
    done = cli("forget", "--persona", "mara", "--user", "theo", "--yes", "--store", str(other / "store"), cwd=other)
    assert done.returncode == 0 and dual.count(NS) == 0 and _threads(other) == []


def test_ids_never_escape_a_folder_and_wildcards_are_literal(tmp_path):
    from dualmem.auth import whose_memory
    from dualmem.schema import Persona

    with pytest.raises(ValueError, match="persona id"):
        Persona(id="../../x", name="X")
    with pytest.raises(ValueError):
        whose_memory(claimed=["a/b"])
    dual = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    dual.upsert(
        [Fact(id="f1", namespace=("mara", "ann"), text="a"), Fact(id="f2", namespace=("mara", "bo%"), text="b")]
    )
    assert dual.count(("mara", "*")) == 0 and dual.count(("mara", "%")) == 0 and dual.count(("mara", "bo%")) == 1
    from dualmem.chat.pending import PendingThread, new_turn, pending_threads
    from dualmem.stores import LanceDBStore

    lg = LanceDBStore(str(tmp_path / "db"), dual=dual)
    PendingThread(lg, ("mara", "ann"), "chat-1").append([new_turn("t-1", "user", "hello", seq=1)], {})
    assert pending_threads(lg, ("mara", "*")) == [] and pending_threads(lg, ("mara", "ann")) == [
        (("mara", "ann"), "chat-1")
    ]
    done = cli(
        "flush",
        "-p",
        "mara",
        "-u",
        "*",
        "--model",
        "fake:memory",
        cwd=tmp_path,
        env={"DUALMEM_STORE_URI": str(tmp_path / "db")},
    )
    assert done.returncode == 0 and "ann" not in done.stdout + done.stderr and "no chat turns pending" in done.stdout


def test_an_explicit_user_wins_over_the_only_user_rule(tmp_path):
    from dualmem.graphs.respond import respond

    dual = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    dual.upsert([Fact(id="f1", namespace=("mara", "u1"), text="u1 grows tomatoes")])
    persona = {"id": "mara", "name": "Mara"}
    settings = Settings(store_uri=str(tmp_path / "db"), embedder="hash:64", user_id="u2", chat_model="fake:memory")
    assert respond("tomatoes", persona, settings=settings, store=dual).items == []  # u2 has no memory: none of u1's
    assert respond("tomatoes", persona, settings=settings.replace(user_id=""), store=dual).items  # no user set: u1's
    env = {"DUALMEM_STORE_URI": str(tmp_path / "db"), "DUALMEM_USER_ID": "u2"}
    done = cli("inspect", "--persona", "mara", cwd=tmp_path, env=env)
    assert "u1 grows tomatoes" not in done.stdout, done.stdout


def test_eval_on_a_malformed_file_writes_nothing(tmp_path):
    (tmp_path / "bad.json").write_text('{"dialogue": 5}')
    done = cli(
        "eval", "bad.json", "-d", "realmem", "-f", "dualmem", "--model", "fake:memory", "--out", "out", cwd=tmp_path
    )
    assert done.returncode == 2 and "bad.json" in done.stderr
    assert not (tmp_path / "out").exists(), "no run folder, run.json or run record before the input is checked"
