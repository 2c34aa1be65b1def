"""`langgraph dev` serves the write and respond graphs and the LanceDB store (real server, loopback).

The server runs with the offline `fake:memory` chat model and hash embeddings so
the test checks the serving path, not a model.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    exe = shutil.which("langgraph", path=str(Path(os.sys.executable).parent)) or shutil.which("langgraph")
    assert exe is not None, "langgraph-cli[inmem] is missing: `make dev` installs it (dev extra)"
    work = tmp_path_factory.mktemp("server")
    port = _free_port()
    env = {
        **os.environ,
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_STORE_URI": str(work / "lancedb"),
        "DUALMEM_CHECKPOINT_PATH": str(work / "ck.sqlite"),
        "LANGSMITH_TRACING": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    }
    log = work / "server.log"
    # the repo's langgraph.json, with absolute paths and a fast TTL sweeper (its store.ttl block is honoured)
    config = json.loads((REPO / "langgraph.json").read_text())
    config["dependencies"] = [str(REPO)]
    config["graphs"] = {name: str(REPO / path.removeprefix("./")) for name, path in config["graphs"].items()}
    config["store"] = {**config["store"], "path": str(REPO / config["store"]["path"].removeprefix("./"))}
    config["store"]["ttl"] = {**config["store"].get("ttl", {}), "sweep_interval_minutes": 1}  # whole minutes only
    (work / "langgraph.json").write_text(json.dumps(config))
    cmd = [
        exe,
        "dev",
        "--no-browser",
        "--no-reload",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--config",
        str(work / "langgraph.json"),
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"langgraph dev exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
            try:
                urllib.request.urlopen(f"{url}/ok", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"langgraph dev did not answer in 240 s:\n{log.read_text()[-4000:]}")
                time.sleep(1)
        yield {"url": url, "env": env}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_write_and_respond_through_the_server(server):
    from langgraph_sdk import get_client

    from dualmem.datasets import load_sample

    sample = load_sample()
    persona = sample.dialogue.persona
    assert persona is not None
    sessions = [s.model_dump(mode="json") for s in sample.dialogue.sessions[:2]]

    async def scenario() -> None:
        client = get_client(url=server["url"])
        assistants = {a["graph_id"] for a in await client.assistants.search()}
        assert {"write", "respond"} <= assistants

        thread = await client.threads.create()
        state = await client.runs.wait(
            thread["thread_id"], "write", input={"persona": persona.model_dump(mode="json"), "sessions": sessions}
        )
        assert isinstance(state, dict) and "__error__" not in state, state
        rows = state.get("report") or []
        assert rows and all(r["status"] == "applied" for r in rows), rows

        # the stored facts and insights come back through the server's store API
        facts = await client.store.search_items(["dualmem", persona.id, "user", "fact"], limit=50)
        insights = await client.store.search_items(["dualmem", persona.id, "user", "insight"], limit=50)
        assert facts["items"] and insights["items"]
        fact_ids = {item["key"] for item in facts["items"]}
        for item in insights["items"]:
            assert set(item["value"]["grounding"]) <= fact_ids, "insights cite stored facts"
        found = await client.store.search_items(
            ["dualmem", persona.id, "user", "fact"], query=facts["items"][0]["value"]["text"], limit=3
        )
        assert found["items"]

        # plain BaseStore values round-trip too
        await client.store.put_item(["notes", persona.id], key="k1", value={"text": "likes tea"})
        got = await client.store.get_item(["notes", persona.id], key="k1")
        assert got["value"] == {"text": "likes tea"}

        thread2 = await client.threads.create()
        reply = await client.runs.wait(
            thread2["thread_id"],
            "respond",
            input={"persona": persona.model_dump(mode="json"), "query": sample.queries[0].text},
        )
        assert isinstance(reply, dict) and reply.get("reply"), reply
        assert reply.get("items"), "the reply state lists the retrieved memory"

    asyncio.run(scenario())


def test_the_server_sees_what_dualmem_ingest_writes_beside_it_per_user(server):
    """A running server reads the commits of another process (`dualmem ingest`) at once, per (persona, user)."""
    from langgraph_sdk import get_client

    from dualmem.datasets import load_sample

    sample = load_sample()
    persona = sample.dialogue.persona
    assert persona is not None
    path = REPO / "dualmem" / "data" / "sample_dialogue.json"
    for user in ("carol", "dave"):
        out = subprocess.run(
            [os.sys.executable, "-m", "dualmem.cli", "ingest", str(path), "--user", user, "--sessions", "1"],
            env={**server["env"], "DUALMEM_CHUNK_TOKENS": "400"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]

    async def scenario() -> None:
        client = get_client(url=server["url"])
        carol = await client.store.search_items(["dualmem", persona.id, "carol", "fact"], limit=100)
        dave = await client.store.search_items(["dualmem", persona.id, "dave", "fact"], limit=100)
        assert carol["items"] and dave["items"], "written by another process after the server started"
        assert all(i["namespace"] == ["dualmem", persona.id, "carol", "fact"] for i in carol["items"])
        both = await client.store.search_items(["dualmem", persona.id], limit=200)  # a prefix covers every user below
        users = {tuple(i["namespace"][:3]) for i in both["items"]}
        assert {("dualmem", persona.id, "carol"), ("dualmem", persona.id, "dave")} <= users
        spaces = await client.store.list_namespaces(prefix=["dualmem", persona.id], limit=100)
        assert ["dualmem", persona.id, "carol", "fact"] in spaces["namespaces"]

        # the respond graph on the server reads the caller's user's memory only
        thread = await client.threads.create()
        text = carol["items"][0]["value"]["text"]
        reply = await client.runs.wait(
            thread["thread_id"],
            "respond",
            input={"persona": persona.model_dump(mode="json"), "query": text},
            context={"user_id": "carol"},
        )
        seen = [i["meta"]["item"]["namespace"] for i in reply.get("items", [])]
        assert seen and all(ns == [persona.id, "carol"] for ns in seen), seen

    asyncio.run(scenario())


def test_the_server_store_honours_item_ttls_and_sees_a_sweep_by_another_process(server):
    """Items put with a TTL through the server expire; `dualmem maintain` (another process) sweeps them."""
    from langgraph_sdk import get_client

    async def scenario() -> None:
        client = get_client(url=server["url"])
        await client.store.put_item(["ttl-test"], key="short", value={"v": 1}, ttl=0.02)  # 1.2 s
        await client.store.put_item(["ttl-test"], key="kept", value={"v": 2})
        assert (await client.store.get_item(["ttl-test"], key="short", refresh_ttl=False))["value"] == {"v": 1}
        await asyncio.sleep(2.0)
        # expired but not swept yet: still visible, as in LangGraph's own stores (the sweeper runs every minute)
        assert await client.store.get_item(["ttl-test"], key="short", refresh_ttl=False) is not None
        out = subprocess.run(
            [os.sys.executable, "-m", "dualmem.cli", "maintain"],
            env=server["env"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert "1 expired store item" in out.stdout, out.stdout
        assert await client.store.get_item(["ttl-test"], key="short") is None
        assert (await client.store.get_item(["ttl-test"], key="kept"))["value"] == {"v": 2}

    asyncio.run(scenario())
