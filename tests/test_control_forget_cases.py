"""`dualmem forget` and `forget()`: confirmation, refusal while a writer holds the namespace, bad input before any
work, every user of a persona, one item with its history, the Python and LangGraph store APIs, exact isolation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dualmem.chat.pending import PendingThread, new_turn, pending_threads
from dualmem.cli import app
from dualmem.control.forget import aforget, forget
from dualmem.control.history import item_history
from dualmem.errors import ConfigurationError
from dualmem.schema import Fact, Insight
from dualmem.stores import InMemoryDualStore, LanceDBStore, LanceDualStore, langgraph_view
from dualmem.testing import HashEmbeddings

WORKER = Path(__file__).parent / "fixtures" / "control_worker.py"
runner = CliRunner()
NAMES = [
    "alice",
    "ali",
    "alice2",
    "o'brien",
    'quo"te',
    "j.doe",
]  # prefixes, quotes, encoded labels: none may widen a filter


def seed(uri: str, persona: str, user: str, word: str) -> LanceDualStore:
    dual = LanceDualStore(uri, HashEmbeddings(64))
    ns = (persona, user)
    dual.upsert(
        [
            Fact(id="f1", namespace=ns, text=f"grows tomatoes {word}"),
            Fact(id="f2", namespace=ns, text=f"rides a bike {word}"),
            Insight(id="i1", namespace=ns, text=f"patience shows {word}", grounding=["f1"]),
        ]
    )
    dual.ledger.mark(ns, f"chunk-{user}", "applied", json.dumps({"applied": [{"text": word, "store_id": "f1"}]}))
    lg = langgraph_view(dual)
    if "." not in user:  # LangGraph labels hold no dot (the pending turns' namespaces encode it)
        lg.put(("dualmem", persona, user, "profile"), "bio", {"text": f"bio {word}"})
    PendingThread(lg, ns, f"chat.{user}").append(
        [new_turn(f"t-{user}", "user", f"said {word}")], {"id": persona, "name": persona}
    )
    return dual


@pytest.fixture
def env(tmp_path, monkeypatch):
    uri = str(tmp_path / "db")
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:64")
    monkeypatch.setenv("DUALMEM_STORE_URI", uri)
    monkeypatch.setenv("DUALMEM_CHECKPOINT_PATH", str(tmp_path / "ck.sqlite"))
    for user in NAMES:
        seed(uri, "mara", user, f"w-{user}")
    seed(uri, "zed", "alice", "w-zed")
    return uri


def counts(uri: str) -> dict[tuple[str, str], int]:
    dual = LanceDualStore(uri, HashEmbeddings(64))
    return {ns: dual.count(ns, status=None) for ns in dual.namespaces()}


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input, terminal_width=200)


def one_error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_forget_asks_first_and_a_no_forgets_nothing(env):
    before = counts(env)
    result = invoke("forget", "-p", "mara", "-u", "alice", input="n\n")
    assert "3 facts" not in result.stdout and "2 facts" in result.stdout and "1 insights" in result.stdout
    assert "nothing was forgotten" in one_error(result, 1) and counts(env) == before
    result = invoke("forget", "-p", "mara", "-u", "alice", input="y\n")
    assert result.exit_code == 0, result.output
    after = counts(env)
    assert ("mara", "alice") not in after and {k: v for k, v in before.items() if k != ("mara", "alice")} == after


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-p", "nobody", "-u", "alice"], "personas with memory: mara, zed"),
        (["-p", "mara", "-u", "bob"], "its users: ali, alice, alice2, j.doe"),
        (["-p", "mara", "-u", "alice' OR '1'='1"], "its users"),
        (["-p", "mara", "-u", "alice", "--item", "nope"], "no item 'nope'"),
        (["-p", "mara"], "--all-users"),
        (["-p", "mara", "--all-users", "--item", "f1"], "--user"),
    ],
)
def test_bad_input_is_one_line_and_touches_nothing(env, args, says):
    before = counts(env)
    assert says in one_error(invoke("forget", *args, "--yes"))
    assert counts(env) == before


def test_forget_refuses_while_a_writer_holds_the_namespace_and_waits_when_asked(env, tmp_path):
    ready, release = tmp_path / "ready", tmp_path / "release"
    args = {"uri": env, "ns": ["mara", "alice"], "ready": str(ready), "release": str(release)}
    holder = subprocess.Popen(
        [sys.executable, str(WORKER), "hold", json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not ready.exists():
        assert holder.poll() is None, holder.stderr.read()
        time.sleep(0.05)
    before = counts(env)
    line = one_error(invoke("forget", "-p", "mara", "-u", "alice", "--yes"))
    assert "test-holder" in line and "--wait" in line and "nothing was deleted" in line
    assert counts(env) == before
    waiter = subprocess.Popen(
        [sys.executable, "-m", "dualmem.cli", "forget", "-p", "mara", "-u", "alice", "--yes", "--wait", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    assert waiter.poll() is None, "it waits for the writer"
    release.touch()
    holder.communicate(timeout=60)
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err[-2000:]
    assert ("mara", "alice") not in counts(env) and counts(env)[("mara", "ali")] == 3


def test_forget_every_user_of_a_persona_leaves_other_personas(env):
    result = invoke("forget", "-p", "mara", "--all-users", "--yes")
    assert result.exit_code == 0, result.output
    assert counts(env) == {("zed", "alice"): 3}
    store = LanceDBStore(env)
    assert store.list_namespaces(prefix=("dualmem",)) == [
        ("dualmem", "zed", "alice", "fact"),
        ("dualmem", "zed", "alice", "insight"),
        ("dualmem", "zed", "alice", "profile"),
    ]
    assert [ns for ns, _ in pending_threads(store)] == [("zed", "alice")]


def test_forget_one_item_removes_it_its_history_and_its_text_in_the_ledger(env, tmp_path):
    dual = LanceDualStore(env, HashEmbeddings(64))
    store = langgraph_view(dual)
    ns = ("dualmem", "mara", "alice", "fact")
    store.put(ns, "f9", {"text": "secret itemmarker one"})
    store.put(ns, "f9", {"text": "secret itemmarker two"})
    dual.ledger.mark(
        ("mara", "alice"),
        "chunk-9",
        "applied",
        json.dumps({"applied": [{"store_id": "f9", "text": "itemmarker three"}]}),
    )
    assert len(item_history(dual, ("mara", "alice"), "f9")) == 2
    result = invoke("forget", "-p", "mara", "-u", "alice", "--item", "f9", "--yes")
    assert result.exit_code == 0, result.output
    assert not [p for p in (tmp_path / "db").rglob("*") if p.is_file() and b"itemmarker" in p.read_bytes()]
    with pytest.raises(ConfigurationError, match="no item"):
        item_history(dual, ("mara", "alice"), "f9")
    assert {i.id for i in dual.list(("mara", "alice"), status=None)} == {"f1", "f2", "i1"}
    assert dual.ledger.applied(("mara", "alice"), "chunk-9"), "the unit stays applied: only the item's text went"


def test_the_python_and_langgraph_store_apis_forget_too(env):
    store = LanceDBStore(env)  # the LangGraph store a graph gets as runtime.store
    report = asyncio.run(aforget("mara", "o'brien", store=store))
    assert report.removed["store/memory"] == 3 and report.removed["store/lg_items"] == 3
    report = forget("mara", 'quo"te', store=LanceDualStore(env, HashEmbeddings(64)))
    assert report.removed["store/memory"] == 3 and report.threads == ['chat.quo"te']
    report = forget("mara", "j.doe", settings=None, store=store)
    assert report.threads == ["chat.j.doe"] and report.removed["store/lg_items"] == 2, (
        "the pending turn and its thread record"
    )
    assert set(counts(env)) == {("mara", "alice"), ("mara", "ali"), ("mara", "alice2"), ("zed", "alice")}
    assert sorted(u for (_, u), _ in pending_threads(store, ("mara",))) == ["ali", "alice", "alice2"]
    with pytest.raises(ConfigurationError, match="in-memory"):
        forget("mara", "alice", store=InMemoryDualStore(HashEmbeddings(64)))
