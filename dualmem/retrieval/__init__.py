"""The one retrieval pipeline every reader of memory ranks with (frameworks, retriever, respond graph, tools, chat).

- :mod:`~dualmem.retrieval.pipeline` — :class:`Ranker`: candidates from the
  store, the query (and its conversation) embedded, features fused by the
  fitted weights, a ranked list; ``ranker="vector" | "hybrid" | "fts"`` is a
  plain store search;
- :mod:`~dualmem.retrieval.candidates`, :mod:`~dualmem.retrieval.features`,
  :mod:`~dualmem.lexical` — what the ranker reads;
- :mod:`~dualmem.retrieval.context` — the recent turns a caller passes as ``context``;
- :mod:`~dualmem.retrieval.weights` — the weights file (the shipped ``learned`` one or your own);
- :mod:`~dualmem.retrieval.fit` — fitting weights on labelled queries, leave one
  persona or conversation out (:mod:`dualmem.evals.ranker_examples` builds them
  from RealMem and LoCoMo);
- :mod:`~dualmem.retrieval.retriever`, :mod:`~dualmem.retrieval.tools` — the
  LangChain retriever and the memory tools (search ranks dual memory);
"""

from dualmem.retrieval.context import ContextTurn, context_turns
from dualmem.retrieval.pipeline import Ranker, rank
from dualmem.retrieval.retriever import DualMemRetriever
from dualmem.retrieval.tools import create_manage_memory_tool, create_search_memory_tool
from dualmem.retrieval.weights import RankerWeights, load_weights

__all__ = [
    "ContextTurn",
    "DualMemRetriever",
    "Ranker",
    "RankerWeights",
    "context_turns",
    "create_manage_memory_tool",
    "create_search_memory_tool",
    "load_weights",
    "rank",
]
