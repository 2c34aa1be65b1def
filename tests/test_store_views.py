"""The LangChain retriever and the agent memory tools over real stores."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.store.memory import InMemoryStore
from typing_extensions import TypedDict

from dualmem.errors import ConfigurationError
from dualmem.retrieval.retriever import DualMemRetriever
from dualmem.retrieval.tools import create_manage_memory_tool, create_search_memory_tool, resolve_namespace
from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import LanceDualStore
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.testing import HashEmbeddings

NS = ("coach", "user")


@pytest.fixture
def dual(tmp_path):
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store.upsert(
        [
            Fact(
                id="f1",
                namespace=NS,
                text="runs five kilometres every morning",
                source=SourceRef(session_id="s1", turn_ids=["s1:2"], chunk_id="c1"),
                event_time="2024-05-01",
            ),
            Fact(
                id="f2",
                namespace=NS,
                text="skipped training after the knee injury",
                source=SourceRef(session_id="s2", turn_ids=["s2:7"]),
            ),
            Insight(
                id="i1",
                namespace=NS,
                text="the injury made running feel unsafe, a fear not a lack of will",
                grounding=["f1", "f2"],
                source=SourceRef(session_id="s2"),
            ),
        ]
    )
    return store


def test_retriever_returns_both_streams_with_metadata(dual):
    docs = DualMemRetriever(store=dual, namespace=NS, k=4).invoke("knee injury and running")
    assert [d.metadata["kind"] for d in docs] == ["fact", "fact", "insight"]  # 2 facts + up to 2 insights (1 stored)
    assert [d.metadata["kind"] for d in DualMemRetriever(store=dual, namespace=NS, k=3).invoke("knee")] == [
        "fact",
        "fact",
        "insight",
    ]
    by_id = {d.metadata["id"]: d for d in docs}
    assert by_id["f1"].metadata["session_id"] == "s1" and by_id["f1"].metadata["turn_ids"] == ["s1:2"]
    assert by_id["f1"].page_content == "runs five kilometres every morning"
    insight = by_id["i1"]
    assert insight.metadata["grounding"] == ["f1", "f2"]
    assert [f["id"] for f in insight.metadata["grounding_facts"]] == ["f1", "f2"]
    assert all(isinstance(d.metadata["score"], float) for d in docs)


def test_retriever_kind_and_merged(dual):
    only = DualMemRetriever(store=dual, namespace=NS, kind="insight", k=5).invoke("fear of running")
    assert [d.metadata["id"] for d in only] == ["i1"] and only[0].metadata["grounding_facts"][1]["id"] == "f2"
    merged = DualMemRetriever(store=dual, namespace=NS, k=2, merged=True, mode="vector").invoke("knee injury")
    assert len(merged) == 2
    scores = [d.metadata["score"] for d in merged]
    assert scores == sorted(scores, reverse=True)
    other = DualMemRetriever(store=dual, namespace=("coach", "someone"), k=5).invoke("knee injury")
    assert other == []


def test_retriever_async(dual):
    docs = asyncio.run(DualMemRetriever(store=dual, namespace=NS, k=1, mode="fts").ainvoke("kilometres"))
    assert docs[0].metadata["id"] == "f1"


@pytest.fixture(params=["lancedb", "inmemory"])
def kv(request, tmp_path):
    index = {"dims": 32, "embed": HashEmbeddings(32), "fields": ["content"]}
    if request.param == "lancedb":
        return LanceDBStore(str(tmp_path / "kv"), index=index)
    return InMemoryStore(index=index)


CFG: RunnableConfig = {"configurable": {"user_id": "alice"}}


def test_manage_and_search_tools_on_a_base_store(kv):
    manage = create_manage_memory_tool(store=kv)
    search = create_search_memory_tool(store=kv)
    out = manage.invoke({"content": "prefers morning workouts"}, config=CFG)
    key = out.split()[-1]
    assert out.startswith("created memory")
    assert kv.get(("memories", "alice"), key).value == {"content": "prefers morning workouts"}
    manage.invoke({"action": "update", "id": key, "content": "prefers evening workouts"}, config=CFG)
    hits = json.loads(search.invoke({"query": "evening workouts"}, config=CFG))
    assert [h["id"] for h in hits] == [key] and hits[0]["content"] == "prefers evening workouts"
    assert json.loads(search.invoke({"query": "evening"}, config={"configurable": {"user_id": "bob"}})) == []
    manage.invoke({"action": "delete", "id": key}, config=CFG)
    assert kv.get(("memories", "alice"), key) is None


def test_manage_tool_rejects_bad_calls(kv):
    manage = create_manage_memory_tool(store=kv, actions_permitted=("create",))
    with pytest.raises(ValueError, match="not permitted"):
        manage.invoke({"action": "delete", "id": "x"}, config=CFG)
    with pytest.raises(ValueError, match="content"):
        manage.invoke({"content": "  "}, config=CFG)
    with pytest.raises(ConfigurationError, match="user_id"):
        manage.invoke({"content": "x"}, config={"configurable": {}})


def test_tools_on_the_dual_store(dual):
    manage = create_manage_memory_tool(NS, store=dual)
    key = manage.invoke({"content": "bought new trail shoes"}).split()[-1]
    assert dual.get(NS, [key])[0].kind == "fact"
    hits = json.loads(create_search_memory_tool(NS, store=dual).invoke({"query": "trail shoes", "limit": 3}))
    assert hits[0]["id"] == key and {h["kind"] for h in hits} <= {"fact", "insight"}


class S(TypedDict):
    note: str
    found: str


def test_tools_take_the_graph_store_when_none_is_given(tmp_path):
    manage, search = create_manage_memory_tool(), create_search_memory_tool()

    def write(state: S, config: RunnableConfig) -> dict:
        manage.invoke({"content": state["note"]}, config=config)
        return {}

    def read(state: S, config: RunnableConfig) -> dict:
        return {"found": search.invoke({"query": state["note"]}, config=config)}

    builder = StateGraph(S)
    builder.add_node("write", write)
    builder.add_node("read", read)
    builder.add_edge(START, "write")
    builder.add_edge("write", "read")
    builder.add_edge("read", END)
    store = LanceDBStore(str(tmp_path / "g"), index={"dims": 32, "embed": HashEmbeddings(32), "fields": ["content"]})
    out = builder.compile(store=store).invoke({"note": "allergic to peanuts", "found": ""}, config=CFG)
    assert json.loads(out["found"])[0]["content"] == "allergic to peanuts"
    assert store.list_namespaces() == [("memories", "alice")]
    with pytest.raises(ConfigurationError, match="store="):
        manage.invoke({"content": "outside a graph"}, config=CFG)


def test_resolve_namespace():
    assert resolve_namespace(("a", "{u}"), {"configurable": {"u": "x"}}) == ("a", "x")
    assert resolve_namespace("solo", None) == ("solo",)


def test_tools_run_in_a_tool_node(tmp_path):
    from langchain_core.messages import AIMessage
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([create_manage_memory_tool(), create_search_memory_tool()]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    store = LanceDBStore(str(tmp_path / "t"), index={"dims": 32, "embed": HashEmbeddings(32), "fields": ["content"]})
    graph = builder.compile(store=store)
    call = {"name": "manage_memory", "args": {"content": "listens to jazz on sundays"}, "id": "call-1"}
    out = graph.invoke({"messages": [AIMessage(content="", tool_calls=[call])]}, config=CFG)
    assert out["messages"][-1].content.startswith("created memory")
    call = {"name": "search_memory", "args": {"query": "jazz"}, "id": "call-2"}
    out = graph.invoke({"messages": [AIMessage(content="", tool_calls=[call])]}, config=CFG)
    assert json.loads(out["messages"][-1].content)[0]["content"] == "listens to jazz on sundays"


def test_tools_write_dual_memory_facts_through_the_graph_store(tmp_path):
    """LangMem-style tools (``content``) on the server's store, in the dual memory's namespace, write facts."""
    uri = str(tmp_path / "g")
    dual_store = LanceDualStore(uri, HashEmbeddings(32))
    store = LanceDBStore(uri, dual=dual_store)
    manage = create_manage_memory_tool(("dualmem", "mara", "{user_id}", "fact"), store=store)
    key = manage.invoke({"content": "Alice started night shifts"}, config=CFG).split()[-1]
    [fact] = dual_store.get(("mara", "alice"), [key])
    assert fact.kind == "fact" and fact.text == "Alice started night shifts"
    hits = json.loads(
        create_search_memory_tool(("dualmem", "mara", "{user_id}", "fact"), store=store).invoke(
            {"query": "night shifts"}, config=CFG
        )
    )
    assert key in (hits[0].get("key"), hits[0].get("id"))
    assert dual_store.count(("mara", "bob")) == 0  # nothing reaches another user's namespace
