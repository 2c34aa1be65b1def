"""`dualmem mcp`: an MCP client (the official SDK's, and langchain-mcp-adapters in a `create_agent` agent) searches,
adds and forgets over stdio and streamable HTTP; a connection scoped to one user cannot reach another's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixtures.cli_server import cli_server
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

from dualmem.schema import Fact, Insight
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings


@pytest.fixture
def store(tmp_path):
    """A store where mara remembers two users; the environment a served `dualmem mcp` reads."""
    uri = str(tmp_path / "db")
    dual = LanceDualStore(uri, HashEmbeddings(64))
    for user, (a, b) in {
        "alice": ("grows tomatoes on her balcony", "works night shifts"),
        "bob": ("grows tomatoes in a greenhouse", "sails on weekends"),
    }.items():
        ns = ("mara", user)
        dual.upsert(
            [
                Fact(id=f"{user}-1", namespace=ns, text=a),
                Fact(id=f"{user}-2", namespace=ns, text=b),
                Insight(id=f"{user}-i", namespace=ns, text=f"{user} finds calm in routine", grounding=[f"{user}-1"]),
            ]
        )
    env = {
        **os.environ,
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_STORE_URI": uri,
        "DUALMEM_CHECKPOINT_PATH": str(tmp_path / "ck.sqlite"),
    }
    return dual, env


def payload(result) -> object:
    """Return a tool result's value (structured content when the tool declares it)."""
    assert not result.isError, result.content
    if result.structuredContent is not None:
        return result.structuredContent.get("result", result.structuredContent)
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.isError
    return " ".join(getattr(c, "text", "") for c in result.content)


async def test_stdio_server_scoped_to_one_user_searches_adds_and_forgets(store):
    dual, env = store
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "dualmem.cli", "mcp", "--persona", "mara", "--user", "alice"], env=env
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"search_memory", "add_fact", "forget", "memory_history"} <= names
        hits = payload(await session.call_tool("search_memory", {"query": "tomatoes"}))
        assert hits and {h["id"] for h in hits} <= {"alice-1", "alice-2", "alice-i"} and hits[0]["id"] == "alice-1"
        assert "scoped to another user" in error_text(
            await session.call_tool("search_memory", {"query": "tomatoes", "user": "bob"})
        )
        assert "scoped" in error_text(await session.call_tool("forget", {"everything": True, "user": "bob"}))
        added = payload(await session.call_tool("add_fact", {"text": "adopted a grey cat named Pixel"}))
        assert (
            payload(await session.call_tool("search_memory", {"query": "grey cat Pixel", "limit": 1}))[0]["id"]
            == added["id"]
        )
        assert [h["op"] for h in payload(await session.call_tool("memory_history", {"item_id": added["id"]}))] == [
            "ADD"
        ]
        payload(await session.call_tool("forget", {"item_id": "alice-2"}))
        assert "alice-2" not in {
            h["id"] for h in payload(await session.call_tool("search_memory", {"query": "night shifts"}))
        }
        assert "either" in error_text(await session.call_tool("forget", {}))
        done = payload(await session.call_tool("forget", {"everything": True}))
        assert done["removed"]["store/memory"] == 3
        assert payload(await session.call_tool("search_memory", {"query": "tomatoes"})) == []
    assert dual.count(("mara", "alice"), status=None) == 0 and dual.count(("mara", "bob")) == 3


@pytest.fixture
def http_server(store, tmp_path):
    """`dualmem mcp --transport http` on a free loopback port, scoped per connection; yields its URL."""
    with cli_server(["mcp", "--transport", "http"], store[1], tmp_path / "mcp.log") as port:
        yield f"http://127.0.0.1:{port}/mcp"


async def test_http_connections_are_scoped_by_headers_or_per_call(http_server, store):
    dual, _ = store
    alice = {"X-DualMem-Persona": "mara", "X-DualMem-User": "alice"}
    async with (
        streamablehttp_client(http_server, headers=alice) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        hits = payload(await session.call_tool("search_memory", {"query": "grows tomatoes"}))
        assert hits and all(h["id"].startswith("alice") for h in hits)
        assert "scoped to another user" in error_text(
            await session.call_tool("search_memory", {"query": "sails", "user": "bob"})
        )
        assert "scoped to another persona" in error_text(
            await session.call_tool("add_fact", {"text": "x", "persona": "zed"})
        )
        payload(await session.call_tool("add_fact", {"text": "learns the cello"}))
    async with streamablehttp_client(http_server) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        assert "name the persona" in error_text(await session.call_tool("search_memory", {"query": "cello"}))
        hits = payload(
            await session.call_tool("search_memory", {"query": "cello sails", "persona": "mara", "user": "bob"})
        )
        assert hits and all(h["id"].startswith("bob") for h in hits), "bob's memory has no cello"
    assert {i.text for i in dual.list(("mara", "alice"))} >= {"learns the cello"}
    assert "learns the cello" not in {i.text for i in dual.list(("mara", "bob"))}


async def test_langchain_mcp_adapters_load_the_tools_into_an_agent(http_server):
    from langchain.agents import create_agent
    from langchain_mcp_adapters.client import MultiServerMCPClient

    client = MultiServerMCPClient(
        {
            "dualmem": {
                "transport": "streamable_http",
                "url": http_server,
                "headers": {"X-DualMem-Persona": "mara", "X-DualMem-User": "bob"},
            }
        }
    )
    tools = {t.name: t for t in await client.get_tools()}
    model = FakeChatModel(responses=[{"query": "where does he grow tomatoes", "limit": 3}, "In a greenhouse."])
    agent = create_agent(model, [tools["search_memory"]])
    out = await agent.ainvoke({"messages": [{"role": "user", "content": "Where do I grow tomatoes?"}]})
    found = [m for m in out["messages"] if m.type == "tool"]
    assert found and "greenhouse" in str(found[0].content) and "balcony" not in str(found[0].content)
    assert out["messages"][-1].content == "In a greenhouse."


TOKENS = {"tok-alice-0001": "alice", "tok-bob-00002": {"identity": "bob"}}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def auth_server(store, tmp_path):
    """`dualmem mcp --transport http --tokens FILE`: two users' bearer tokens; yields the URL."""
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    args = ["mcp", "--transport", "http", "--tokens", str(tmp_path / "tokens.json")]
    with cli_server(args, store[1], tmp_path / "mcp-auth.log") as port:
        yield f"http://127.0.0.1:{port}/mcp"


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


async def test_http_with_tokens_scopes_every_call_to_the_token_s_user(auth_server, store, tmp_path):
    import httpx

    dual, _ = store
    async with httpx.AsyncClient() as http:
        assert (await http.post(auth_server, json=INIT, headers=ACCEPT)).status_code == 401, "no token: refused"
        assert (
            await http.post(auth_server, json=INIT, headers={**ACCEPT, **bearer("tok-wrong-000")})
        ).status_code == 401
    alice = bearer("tok-alice-0001", **{"X-DualMem-Persona": "mara"})
    async with streamablehttp_client(auth_server, headers=alice) as (read, write, _), ClientSession(read, write) as s:
        await s.initialize()
        hits = payload(await s.call_tool("search_memory", {"query": "grows tomatoes sails"}))
        assert hits and all(h["id"].startswith("alice") for h in hits)
        for args in ({"user": "bob"}, {"user": "bob", "persona": "mara"}):
            error = error_text(await s.call_tool("search_memory", {"query": "sails", **args}))
            assert "AccessDenied" in error or "another user" in error
            assert "bob" not in error
        error = error_text(await s.call_tool("forget", {"everything": True, "user": "bob"}))
        assert "another user" in error and "bob" not in error
        error = error_text(await s.call_tool("forget", {"item_id": "bob-1"}))  # bob's id, through alice's scope
        assert "bob" not in error.replace("bob-1", "") and str(tmp_path) not in error and "db" not in error
    assert dual.count(("mara", "bob")) == 3, "bob's memory is untouched"
    # a header naming another user is a claim like an argument: refused
    bob_claim = bearer("tok-alice-0001", **{"X-DualMem-Persona": "mara", "X-DualMem-User": "bob"})
    async with (
        streamablehttp_client(auth_server, headers=bob_claim) as (read, write, _),
        ClientSession(read, write) as s,
    ):
        await s.initialize()
        assert "another user" in error_text(await s.call_tool("search_memory", {"query": "sails"}))


async def test_a_session_keeps_the_credentials_it_was_initialized_with(auth_server):
    import httpx

    async with httpx.AsyncClient() as http:
        first = await http.post(auth_server, json=INIT, headers={**ACCEPT, **bearer("tok-alice-0001")})
        assert first.status_code == 200
        session = first.headers["mcp-session-id"]
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "search_memory", "arguments": {"query": "sails", "persona": "mara"}},
        }
        for other in (bearer("tok-bob-00002"), bearer("tok-alice-0001", **{"X-DualMem-User": "bob"})):
            again = await http.post(auth_server, json=call, headers={**ACCEPT, **other, "mcp-session-id": session})
            assert again.status_code == 403 and "new session" in again.text


def test_http_beyond_loopback_without_tokens_is_refused_in_one_line(store):
    _, env = store
    env = {k: v for k, v in env.items() if k != "DUALMEM_TOKENS"}
    done = subprocess.run(
        [sys.executable, "-m", "dualmem.cli", "mcp", "--transport", "http", "--host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--tokens" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
