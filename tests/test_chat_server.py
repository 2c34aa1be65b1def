"""Chat memory on a real `langgraph dev` through `langgraph_sdk`: a chat turn, the scheduled write run, the memory in the store API.

The server runs the docs' server example (docs/guides/server.md, "A chat agent on the server") as written: its
`agent.py` (only the model spec swapped for the offline `fake:memory` model) and its `langgraph.json` (plus the
`respond` graph), with hash embeddings and a quiet time of 3 s; the page's client snippet is run against it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import time
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.langgraph_server import serve

from dualmem.chat.pending import FormationRequest
from dualmem.chat.server import formation_thread
from dualmem.config import Settings

pytestmark = pytest.mark.slow
PERSONA_ID = "mara-okafor"  # the bundled sample's persona, as in the docs
PAGE = REPO / "docs" / "guides" / "server.md"
IDLE_S = 3


def docs_server_blocks() -> tuple[str, dict, str]:
    """Return the docs' server example: agent.py, langgraph.json and the client snippet, as written."""
    section = PAGE.read_text().split("## A chat agent on the server", 1)[1].split("\n## ", 1)[0]
    agent, client = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    config = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    assert agent.startswith("# agent.py") and "get_sync_client" in client
    return agent, config, client


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work: Path = tmp_path_factory.mktemp("chat-server")
    agent, config, _ = docs_server_blocks()
    assert agent.count('"openai:gpt-4o-mini"') == 1
    (work / "agent.py").write_text(  # the docs' agent.py; the model comes from the settings (fake:memory here)
        "from dualmem.models import load_chat_model\n" + agent.replace('"openai:gpt-4o-mini"', "load_chat_model(None)")
    )
    assert config["graphs"]["agent"] == "./agent.py:agent" and config["dependencies"] == ["."]
    config["dependencies"] = [str(REPO)]  # the docs' "." is the user's project, which depends on dualmem
    config["graphs"]["agent"] = str(work / "agent.py") + ":agent"
    config["graphs"]["respond"] = "dualmem.graphs.respond:graph"
    env = {
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_STORE_URI": str(work / "lancedb"),
        "DUALMEM_CHECKPOINT_PATH": str(work / "ck.sqlite"),
        "DUALMEM_FORMATION_IDLE_S": str(IDLE_S),
    }
    with serve(config, work, env, cwd=REPO) as url:
        yield url


async def _until(check, timeout: float = 60.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(every)


async def _finished(client, thread: str) -> list[dict]:
    """Return the thread's runs once none is pending or running."""

    async def done():
        runs = await client.runs.list(thread, limit=20)
        return runs if runs and all(r["status"] not in ("pending", "running") for r in runs) else None

    return await _until(done) or await client.runs.list(thread, limit=20)


def _formation_thread(user: str, thread: str) -> str:
    return formation_thread(FormationRequest({}, (PERSONA_ID, user), thread, Settings()))


def test_a_chat_turn_then_the_scheduled_write_run_then_the_memory_in_the_store_api(server):
    from langgraph_sdk import get_client

    async def scenario() -> None:
        client = get_client(url=server)
        thread = (await client.threads.create())["thread_id"]
        said = [
            "I work night shifts at the warehouse and they drain me",
            "Last night I could not sleep at all after my shift",
        ]
        started = time.monotonic()
        for text in said:  # two quick messages: the second postpones the write
            out = await client.runs.wait(
                thread, "agent", input={"messages": [{"role": "user", "content": text}]}, context={"user_id": "alice"}
            )
            assert out["messages"][-1]["type"] == "ai" and out["messages"][-1]["content"].startswith("(fake reply)")
        pending = await client.store.search_items(["dualmem_pending", PERSONA_ID, "alice", thread], limit=50)
        turns = [i for i in pending["items"] if i["key"].startswith("t-")]
        assert [t["value"]["text"] for t in sorted(turns, key=lambda t: (t["value"]["at"], t["value"]["seq"]))][
            ::2
        ] == said
        assert await client.store.search_items(["dualmem", PERSONA_ID, "alice", "fact"]) == {
            "items": []
        }  # not yet written

        async def facts():
            return (await client.store.search_items(["dualmem", PERSONA_ID, "alice", "fact"], limit=50))["items"]

        written = await _until(facts)
        assert written and time.monotonic() - started >= IDLE_S, "written once the thread was quiet"
        assert {tuple(i["namespace"]) for i in written} == {("dualmem", PERSONA_ID, "alice", "fact")}
        assert written[0]["value"]["source"]["session_id"] == thread

        async def insights_now():
            return (await client.store.search_items(["dualmem", PERSONA_ID, "alice", "insight"], limit=50))["items"]

        insights = await _until(
            insights_now, timeout=10.0, every=0.1
        )  # the insights table commits just after the facts'
        assert insights and set(insights[0]["value"]["grounding"]) <= {f["key"] for f in written}

        runs = await _finished(client, _formation_thread("alice", thread))
        assert [(r["status"], r["metadata"]["dualmem_formation"]) for r in runs] == [("success", "quiet")], (
            "one write run: debounced"
        )
        left = await client.store.search_items(["dualmem_pending", PERSONA_ID, "alice", thread], limit=50)
        assert not [i for i in left["items"] if i["key"].startswith("t-")]  # the written turns left the pending list

        # the next turn of another user recalls nothing of alice's
        other = (await client.threads.create())["thread_id"]
        await client.runs.wait(
            other,
            "agent",
            input={"messages": [{"role": "user", "content": "night shifts"}]},
            context={"user_id": "bob"},
        )
        assert (await client.store.search_items(["dualmem", PERSONA_ID, "bob", "fact"]))["items"] == []

    asyncio.run(scenario())


def test_the_respond_graph_remembers_through_the_same_scheduled_write(server):
    from langgraph_sdk import get_client

    from dualmem.datasets import load_sample

    persona = load_sample().dialogue.persona.model_dump(mode="json")

    async def scenario() -> None:
        client = get_client(url=server)
        thread = (await client.threads.create())["thread_id"]
        out = await client.runs.wait(
            thread,
            "respond",
            input={"persona": persona, "query": "My sister Ana moved to Lyon with her kids", "remember": True},
            context={"user_id": "carol"},
        )
        assert out["reply"] and out["pending"]["thread"] == thread and out["pending"]["turns"] == 2

        async def facts():
            return (await client.store.search_items(["dualmem", PERSONA_ID, "carol", "fact"], limit=50))["items"]

        written = await _until(facts)
        assert written and "Ana moved to Lyon" in written[0]["value"]["text"]
        runs = await _finished(client, _formation_thread("carol", thread))
        assert [r["status"] for r in runs] == ["success"]

    asyncio.run(scenario())


def test_the_docs_client_snippet_runs_as_written(server):
    """The docs' client code, with the test server's URL: a chat turn, then (once the scheduled write ran) the memory."""
    _, _, client_code = docs_server_blocks()
    first, _, last = client_code.partition("# once the thread has been quiet")
    last = last.split("\n", 1)[1]
    assert "http://127.0.0.1:8123" in first and last.strip().startswith("print(client.store.search_items(")
    scope: dict = {}
    exec(first.replace("http://127.0.0.1:8123", server), scope)
    from langgraph_sdk import get_client

    async def scenario() -> None:
        client = get_client(url=server)
        await _finished(
            client, _formation_thread("alice", scope["thread"])
        )  # the scheduled write run, after the quiet time

        async def insights():
            return (await client.store.search_items(["dualmem", PERSONA_ID, "alice", "insight"]))["items"]

        assert await _until(insights)

    asyncio.run(scenario())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(last, scope)
    out = printed.getvalue()
    assert "'items': [" in out and "I start night shifts next week" in out and "'insight'" in out
