"""Memory stores: the LanceDB dual store and its LangGraph / LangChain views."""

from dualmem.stores.dual import DualResult, DualStore, ScoredItem

__all__ = ["DualResult", "DualStore", "ScoredItem"]
