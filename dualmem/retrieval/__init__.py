"""LLM-free retrieval helpers: an embedding cache, BM25, and session- and turn-level rankers."""

from dualmem.retrieval.bm25 import BM25, tokenize
from dualmem.retrieval.cache import CachedEmbeddings, EmbeddingCache
from dualmem.retrieval.sessions import SessionIndex, SessionRankConfig, rank_by_best_item
from dualmem.retrieval.turns import TurnIndex, TurnRankConfig

__all__ = [
    "BM25",
    "CachedEmbeddings",
    "EmbeddingCache",
    "SessionIndex",
    "SessionRankConfig",
    "TurnIndex",
    "TurnRankConfig",
    "rank_by_best_item",
    "tokenize",
]
