"""Many users on one real `langgraph dev` with authentication: whose memory it is comes from the token, never the client.

The server runs the docs' auth file (docs/guides/many-users.md) as written — bearer tokens for alice, bob and an
administrator, plus `dualmem.auth.protect(auth)` — and serves the write and respond graphs and the docs' chat agent
(`create_agent` + `DualMemMiddleware`), with the offline `fake:memory` model and hash embeddings. Clients are
`langgraph_sdk` clients holding each user's token.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from conftest import REPO
from fixtures.langgraph_server import serve

pytestmark = pytest.mark.slow
PAGE = REPO / "docs" / "guides" / "many-users.md"
TOKENS = {
    "t-alice": {"identity": "alice"},
    "t-bob": {"identity": "bob"},
    "t-ops": {"identity": "ops", "permissions": ["dualmem:admin"]},
}


def docs_auth_file() -> str:
    code = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)[0]
    assert code.startswith("# auth.py") and "protect(auth)" in code
    return code


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work: Path = tmp_path_factory.mktemp("auth-server")
    (work / "auth.py").write_text(docs_auth_file())
    (work / "agent.py").write_text(
        "from langchain.agents import create_agent\n"
        "from dualmem.chat import DualMemMiddleware\n"
        "from dualmem.datasets import load_sample_persona\n"
        "from dualmem.models import load_chat_model\n"
        "agent = create_agent(load_chat_model(None), tools=[], middleware=[DualMemMiddleware(load_sample_persona())])\n"
    )
    config = {
        "dependencies": [str(REPO)],
        "graphs": {
            "write": "dualmem.graphs.write:graph",
            "respond": "dualmem.graphs.respond:graph",
            "agent": str(work / "agent.py") + ":agent",
        },
        "store": {"path": "dualmem.stores.langgraph_store.make_store"},
        "auth": {"path": str(work / "auth.py") + ":auth"},
    }
    env = {
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_STORE_URI": str(work / "lancedb"),
        "DUALMEM_CHECKPOINT_PATH": str(work / "ck.sqlite"),
        "DUALMEM_FORMATION_IDLE_S": "2",
        "DUALMEM_DEMO_TOKENS": json.dumps(TOKENS),
    }
    with serve(config, work, env, cwd=REPO) as url:
        yield url


def client_of(url: str, token: str | None):
    from langgraph_sdk import get_client

    return get_client(url=url, headers={"Authorization": f"Bearer {token}"} if token else {"Authorization": ""})


def sample():
    from dualmem.datasets import load_sample

    s = load_sample()
    return s.dialogue.persona.model_dump(mode="json"), [x.model_dump(mode="json") for x in s.dialogue.sessions[:2]], s


async def status_of(call) -> int:
    from langgraph_sdk.errors import APIStatusError

    try:
        await call
    except (httpx.HTTPStatusError, APIStatusError) as exc:
        response = getattr(exc, "response", None)
        return int(getattr(response, "status_code", 0) or getattr(exc, "status_code", 0))
    return 200


async def failed_run(client, graph: str, **kwargs) -> str:
    """Run ``graph`` on a new thread; return the run's error text ('' when it succeeded)."""
    thread = (await client.threads.create())["thread_id"]
    out = await client.runs.wait(thread, graph, raise_error=False, **kwargs)
    if isinstance(out, dict) and "__error__" in out:
        return json.dumps(out["__error__"])
    return ""


def test_memory_threads_and_store_items_belong_to_the_authenticated_user(served):
    persona, sessions, data = sample()
    pid = persona["id"]
    query = data.queries[0].text

    async def scenario() -> None:
        alice, bob, ops = client_of(served, "t-alice"), client_of(served, "t-bob"), client_of(served, "t-ops")
        assert await status_of(client_of(served, None).threads.create()) in (401, 403), "no token: refused"
        assert await status_of(client_of(served, "t-wrong").threads.create()) in (401, 403)

        # alice writes without naming a user: her namespace, not the shared default
        thread = (await alice.threads.create())["thread_id"]
        state = await alice.runs.wait(thread, "write", input={"persona": persona, "sessions": sessions})
        assert isinstance(state, dict) and "__error__" not in state, state
        assert state["namespace"] == [pid, "alice"]
        facts = (await alice.store.search_items(["dualmem", pid, "alice", "fact"], limit=100))["items"]
        assert facts, "alice reads her own memory through the store API"
        alice_ids = {f["key"] for f in facts}
        assert (await ops.store.search_items(["dualmem", pid, "user", "fact"], limit=100))["items"] == []

        # bob, with his own token: respond without a user id reads his (empty) memory, never alice's
        out = await bob.runs.wait(None, "respond", input={"persona": persona, "query": query})
        assert out["namespace"] == [pid, "bob"] and not {i.get("id") for i in out["items"]} & alice_ids
        # ... and every way of claiming alice is refused, naming no one else
        for claim in (
            {"context": {"user_id": "alice"}},
            {"context": {"options": {"user_id": "alice"}}},
            {"config": {"configurable": {"user_id": "alice"}}},
        ):
            error = await failed_run(bob, "respond", input={"persona": persona, "query": query}, **claim)
            assert "AccessDenied" in error and "alice" not in error, (claim, error)
        error = await failed_run(
            bob, "respond", input={"persona": persona, "query": query, "namespace": [pid, "alice"]}
        )
        assert "AccessDenied" in error
        error = await failed_run(
            bob, "write", input={"persona": persona, "sessions": sessions[:1]}, context={"user_id": "alice"}
        )
        assert "AccessDenied" in error

        # the store API: bob cannot list, search, get, put or delete alice's items
        key = next(iter(alice_ids))
        for call in (
            bob.store.search_items(["dualmem", pid, "alice", "fact"]),
            bob.store.search_items(["dualmem", pid]),
            bob.store.search_items(["dualmem"]),
            bob.store.list_namespaces(prefix=["dualmem"]),
            bob.store.list_namespaces(),
            bob.store.get_item(["dualmem", pid, "alice", "fact"], key=key),
            bob.store.put_item(["dualmem", pid, "alice", "fact"], key="planted", value={"text": "x"}),
            bob.store.delete_item(["dualmem", pid, "alice", "fact"], key=key),
            bob.store.put_item(["alice", "notes"], key="k", value={"v": 1}),
        ):
            assert await status_of(call) == 403
        assert key in {
            f["key"] for f in (await alice.store.search_items(["dualmem", pid, "alice", "fact"], limit=100))["items"]
        }
        # an application namespace starting with the caller's identity is theirs
        await bob.store.put_item(["bob", "notes"], key="k", value={"v": 1})
        assert (await bob.store.get_item(["bob", "notes"], key="k"))["value"] == {"v": 1}

        # threads: alice's thread, its state and runs are invisible to bob
        assert await status_of(bob.threads.get(thread)) == 404
        assert await status_of(bob.threads.get_state(thread)) in (403, 404)
        assert thread not in {t["thread_id"] for t in await bob.threads.search(limit=100)}
        assert await status_of(bob.runs.list(thread)) in (403, 404) or await bob.runs.list(thread) == []
        assert await status_of(bob.threads.delete(thread)) == 404
        assert (await alice.threads.get(thread))["metadata"]["owner"] == "alice"
        # a client cannot create a thread on someone else's behalf
        planted = await bob.threads.create(metadata={"owner": "alice"})
        assert planted["metadata"]["owner"] == "bob"

        # the administrator can read alice's memory, threads and store items
        assert await ops.threads.get(thread)
        assert (await ops.store.search_items(["dualmem", pid, "alice", "fact"], limit=100))["items"]
        out = await ops.runs.wait(
            None, "respond", input={"persona": persona, "query": query}, context={"user_id": "alice"}
        )
        assert out["namespace"] == [pid, "alice"] and out["items"]

    asyncio.run(scenario())


def test_the_chat_middleware_forms_memory_of_the_authenticated_user_only(served):
    pid = "mara-okafor"

    async def scenario() -> None:
        alice, bob, ops = client_of(served, "t-alice"), client_of(served, "t-bob"), client_of(served, "t-ops")
        said = "I work night shifts at the warehouse and they drain me"
        thread = (await alice.threads.create())["thread_id"]
        out = await alice.runs.wait(thread, "agent", input={"messages": [{"role": "user", "content": said}]})
        assert out["messages"][-1]["type"] == "ai"
        pending = await alice.store.search_items(["dualmem_pending", pid, "alice", thread], limit=50)
        assert [i for i in pending["items"] if i["key"].startswith("t-")], "the turn waits in alice's namespace"

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            facts = (await alice.store.search_items(["dualmem", pid, "alice", "fact"], limit=100))["items"]
            if any(said in f["value"]["text"] for f in facts):
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("the scheduled write never formed alice's chat memory")
        assert (await ops.store.search_items(["dualmem", pid, "user", "fact"], limit=100))["items"] == []

        # bob's agent turn claiming alice is refused; his own turn recalls nothing of hers
        error = await failed_run(
            bob,
            "agent",
            input={"messages": [{"role": "user", "content": "night shifts"}]},
            context={"user_id": "alice"},
        )
        assert "AccessDenied" in error
        assert await status_of(bob.store.search_items(["dualmem_pending", pid, "alice", thread])) == 403

    asyncio.run(scenario())
