"""`dualmem forget`: every trace of a user goes — down to the bytes of every file in the store folder or bucket —
and nothing of anyone else (real LanceDB on disk and on an S3-compatible server, real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from dualmem.chat.pending import PendingThread, new_turn, pending_threads
from dualmem.config import Settings
from dualmem.control.checkpoints import thread_metadata
from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.retrieval import Ranker
from dualmem.schema import Persona, Session, Turn
from dualmem.stores import LanceDBStore, LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings, editing_writer
from dualmem.writer import write_history

WORKER = Path(__file__).parent / "fixtures" / "control_worker.py"
PERSONA = Persona(id="mara", name="Mara")
QUERIES = ["garden tomatoes", "night shift", "sailing boat", "the user said", "sign", "updated fact"]
FRAMEWORKS = ("raw-turns", "full-context")


def history(user: str, word: str, sessions: int = 6) -> list[Session]:
    """A user's sessions; every user turn says ``word`` (the marker, for the user to forget)."""
    topics = ["garden tomatoes", "night shift", "sailing boat", "old piano", "winter coat", "bakery job"]
    return [
        Session(
            id=f"{user}-s{s}",
            time=f"2024-02-{s + 1:02d}",
            turns=[
                Turn(
                    id=f"{user}-s{s}-t{t}",
                    role="user" if t % 2 == 0 else "assistant",
                    text=f"about my {topics[(s + t) % len(topics)]} {word}{s}x{t} and more words here",
                )
                for t in range(4)
            ],
        )
        for s in range(sessions)
    ]


class Chat(TypedDict):
    said: list[str]


def _remember(state: Chat) -> dict:
    return {"said": [*state["said"], "noted"]}


def checkpoint(path: str, thread: str, text: str, metadata: dict | None = None) -> None:
    """Save a checkpointed run of a tiny chat graph on ``thread`` (its state holds ``text``)."""
    builder = StateGraph(Chat)
    builder.add_node("remember", _remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    with SqliteSaver.from_conn_string(path) as saver:
        builder.compile(checkpointer=saver).invoke(
            {"said": [text]}, {"configurable": {"thread_id": thread}, "metadata": metadata or {}}
        )


def threads_in(path: str) -> set[str]:
    with SqliteSaver.from_conn_string(path) as saver:
        return {t.config["configurable"]["thread_id"] for t in saver.list(None)}


def populate(settings: Settings, user: str, word: str) -> None:
    """Give ``user`` everything forget must find: memory with history, pending chat turns, store items, two
    baseline frameworks' records, checkpoints (one found by its chat record, one by its metadata)."""
    opts = settings.store_options or None
    dual = LanceDualStore(settings.store_uri, HashEmbeddings(64), storage_options=opts)
    write_history(
        history(user, word),
        PERSONA,
        settings=settings,
        model=FakeChatModel(responses=[editing_writer], cycle=True),
        store=dual,
        namespace=(PERSONA.id, user),
        progress=False,
    )
    lg = LanceDBStore(settings.store_uri, dual=dual)
    PendingThread(lg, (PERSONA.id, user), f"chat-{user}").append(
        [new_turn(f"t-{user}", "user", f"pending words {word}-pending", seq=1)], PERSONA.model_dump(mode="json")
    )
    lg.put(("dualmem", PERSONA.id, user, "profile"), "bio", {"text": f"profile {word}-profile"})
    lg.put(("dualmem", PERSONA.id, user, "fact"), "api-fact", {"text": f"put through the store {word}-api"})
    for name in FRAMEWORKS:
        ctx = FrameworkContext(
            namespace=(PERSONA.id, user), settings=settings, persona=PERSONA, embeddings=HashEmbeddings(64)
        )
        open_framework(name, ctx).ingest(history(user, word, 1)[0])
    checkpoint(settings.checkpoint_path, f"chat-{user}", f"chat {word}-checkpoint")
    checkpoint(settings.checkpoint_path, f"side-{user}", f"side {word}-side", thread_metadata(PERSONA.id, user))


def snapshot(dual: LanceDualStore, user: str) -> dict:
    ns = (PERSONA.id, user)
    return {
        "items": sorted((i.id, i.text, i.status, i.updated_at.isoformat()) for i in dual.list(ns, status=None)),
        "hits": [[(h.item.id, round(h.score, 6)) for h in Ranker().rank(dual, ns, q, 5)] for q in QUERIES],
    }


def files_holding(root: Path, marker: bytes) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and marker in p.read_bytes())


def objects_holding(s3: dict, prefix: str, marker: bytes) -> tuple[int, list[str]]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3["endpoint"],
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"], Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    return len(keys), [k for k in keys if marker in client.get_object(Bucket=s3["bucket"], Key=k)["Body"].read()]


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """Settings for a fresh store: a local folder, or a prefix of a bucket on the S3-compatible server."""
    ckpt = str(tmp_path / "checkpoints.sqlite")
    if request.param == "local":
        return {
            "settings": Settings(store_uri=str(tmp_path / "db"), checkpoint_path=ckpt, embedder="hash:64"),
            "root": tmp_path,
        }
    s3 = request.getfixturevalue("s3_server")
    prefix = f"forget-{time.time_ns()}"
    settings = Settings(
        store_uri=f"s3://{s3['bucket']}/{prefix}",
        store_options=s3["options_json"],
        checkpoint_path=ckpt,
        embedder="hash:64",
    )
    return {"settings": settings, "root": tmp_path, "s3": s3, "prefix": prefix}


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_STORE_URI": settings.store_uri,
        "DUALMEM_STORE_OPTIONS": settings.store_options,
        "DUALMEM_CHECKPOINT_PATH": settings.checkpoint_path,
    }


def test_forget_leaves_no_byte_of_the_user_and_nothing_else_changes(where):
    settings, root = where["settings"], where["root"]
    marker = f"qzv{uuid.uuid4().hex[:10]}"
    populate(settings, "alice", marker)
    populate(settings, "bob", "plainword")
    dual = LanceDualStore(settings.store_uri, HashEmbeddings(64), storage_options=settings.store_options or None)
    bob_before = snapshot(dual, "bob")

    def leftovers() -> list[str]:
        found = files_holding(root, marker.encode())  # the store folder (local) and the checkpointer, its WAL too
        if "s3" in where:
            total, held = objects_holding(where["s3"], where["prefix"], marker.encode())
            assert total > 0
            found += held
        return found

    assert len(leftovers()) >= 5, "the scan finds the marker before the forget (in data files and the checkpointer)"
    env = cli_env(settings)
    ready, go = root / "ready", root / "go"
    watch = {
        "uri": settings.store_uri,
        "persona": PERSONA.id,
        "users": ["alice", "bob"],
        "queries": QUERIES,
        "ready": str(ready),
        "go": str(go),
    }
    reader = subprocess.Popen(
        [sys.executable, str(WORKER), "watch", json.dumps(watch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.time() + 120
    while not ready.exists():
        assert reader.poll() is None and time.time() < deadline, (
            reader.stderr.read() if reader.poll() is not None else "reader timed out"
        )
        time.sleep(0.1)

    done = subprocess.run(
        [sys.executable, "-m", "dualmem.cli", "forget", "--persona", "mara", "--user", "alice", "--yes"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "store/memory" in done.stdout and "raw-turns/memory" in done.stdout and "full-context" in done.stdout

    # LanceDB writes new versions afterwards (bob keeps talking): nothing of alice comes back
    lg = LanceDBStore(settings.store_uri, dual=dual)
    lg.put(("notes",), "after", {"text": "written after the forget"})
    dual.maintain()
    assert leftovers() == []

    go.touch()
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err[-3000:]
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["before"]["alice"]["count"] > 0 and any(seen["before"]["alice"]["hits"])
    assert seen["after"]["alice"] == {"count": 0, "items": [], "hits": [[] for _ in QUERIES], "store": []}
    assert seen["after"]["bob"] == seen["before"]["bob"], "the reader opened before the forget sees bob unchanged"

    assert snapshot(dual, "bob") == bob_before, "bob's memory and retrieval results are unchanged"
    assert [u for (_, u), _ in pending_threads(lg, ("mara",))] == ["bob"]
    assert lg.get(("dualmem", "mara", "bob", "profile"), "bio") is not None
    assert threads_in(settings.checkpoint_path) == {"chat-bob", "side-bob"}
    for name in FRAMEWORKS:
        ctx = FrameworkContext(
            namespace=("mara", "bob"), settings=settings, persona=PERSONA, embeddings=HashEmbeddings(64)
        )
        assert open_framework(name, ctx).retrieve("garden tomatoes", 3), f"{name} still serves bob"


@pytest.mark.parametrize("backend", ["memory", "lance"])
def test_a_store_forgets_a_namespace_and_an_item_through_its_own_methods(backend, tmp_path):
    from dualmem.errors import LeaseTimeout
    from dualmem.memory.versions import VERSION_OF
    from dualmem.schema import MemoryItem
    from dualmem.stores import InMemoryDualStore
    from dualmem.stores._sql import ns_key

    marker = f"qzv{uuid.uuid4().hex[:10]}"
    if backend == "memory":
        dual = InMemoryDualStore(HashEmbeddings(64))
    else:
        dual = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    alice, bob = (PERSONA.id, "alice"), (PERSONA.id, "bob")
    for ns, word in ((alice, marker), (bob, "plainword")):
        dual.upsert([MemoryItem(id=f"f{i}", namespace=ns, kind="fact", text=f"fact {i} {word}") for i in range(3)])
        old = MemoryItem(
            id="v0", namespace=ns, kind="fact", text=f"old {word}", status="superseded", meta={VERSION_OF: "f0"}
        )
        dual.upsert([old])
        plan = {"facts": [{"id": "f0", "text": f"fact 0 {word}"}, {"id": "f1", "text": f"fact 1 {word}"}]}
        dual.ledger.mark(ns, "c1", "applied", json.dumps(plan))

    if backend == "lance":
        assert files_holding(tmp_path, marker.encode()), "the scan finds alice's text before the forget"
    # one item: its row, its version rows and its text in the ledger's plans; nothing else
    assert dual.forget_item(bob, "f0") == {"items": 2, "ledger": 1}
    assert sorted(i.id for i in dual.list(bob, status=None)) == ["f1", "f2"]
    assert json.loads(dual.ledger.look(bob, "c1")[0][1]) == {"facts": [{"id": "f1", "text": "fact 1 plainword"}]}
    bob_before = [(i.id, i.text, i.status, i.updated_at) for i in dual.list(bob, status=None)]
    bob_hits = [(h.item.id, round(h.score, 6)) for h in dual.search(bob, "fact plainword", k=5)]

    with dual.exclusive(alice):  # a writer holds alice: refused before anything is deleted
        with pytest.raises(LeaseTimeout):
            dual.forget_namespace(alice)
    assert dual.count(alice, status=None) == 4

    assert dual.forget_namespace(alice) == {"items": 4, "ledger": 1}
    assert dual.count(alice, status=None) == 0 and not dual.ledger.applied(alice, "c1")
    assert dual.namespaces((PERSONA.id,)) == [bob]
    assert [(i.id, i.text, i.status, i.updated_at) for i in dual.list(bob, status=None)] == bob_before
    assert [(h.item.id, round(h.score, 6)) for h in dual.search(bob, "fact plainword", k=5)] == bob_hits
    assert dual.ledger.applied(bob, "c1")
    if backend == "lance":
        assert files_holding(tmp_path, marker.encode()) == [], "no file holds alice's text, in any version"
        leases = dual.leases.rows.to_arrow().column("namespace").to_pylist()
        assert ns_key(alice) not in leases, "alice's lease row went too"
