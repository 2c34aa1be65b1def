"""Memory stores: the LanceDB dual store and its LangGraph / LangChain views."""

from dualmem.stores.dual import DualResult, DualStore, ScoredItem
from dualmem.stores.langgraph_store import LanceDBStore, make_store
from dualmem.stores.retriever import DualMemRetriever
from dualmem.stores.tools import create_manage_memory_tool, create_search_memory_tool

__all__ = [
    "DualMemRetriever",
    "DualResult",
    "DualStore",
    "LanceDBStore",
    "ScoredItem",
    "create_manage_memory_tool",
    "create_search_memory_tool",
    "make_store",
]
