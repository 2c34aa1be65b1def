"""Memory stores: the LanceDB dual store and its LangGraph view (the LangChain retriever and the memory tools rank
memory, so they live in :mod:`dualmem.retrieval`)."""

from dualmem.stores.dual import DualResult, DualStore, ScoredItem
from dualmem.stores.langgraph_store import LanceDBStore, make_store

__all__ = [
    "DualResult",
    "DualStore",
    "LanceDBStore",
    "ScoredItem",
    "make_store",
]
