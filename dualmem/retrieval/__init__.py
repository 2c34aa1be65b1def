"""LLM-free retrieval helpers: an embedding cache, BM25, session- and turn-level rankers, a query-encoder fine-tuner."""

from dualmem.retrieval.bm25 import BM25, tokenize
from dualmem.retrieval.cache import CachedEmbeddings, EmbeddingCache
from dualmem.retrieval.query_encoder import (
    QueryEncoderConfig,
    QueryGroup,
    QueryTunedEmbeddings,
    encode_queries,
    finetune_query_encoder,
)
from dualmem.retrieval.sessions import SessionIndex, SessionRankConfig, rank_by_best_item
from dualmem.retrieval.turns import TurnIndex, TurnRankConfig

__all__ = [
    "BM25",
    "CachedEmbeddings",
    "EmbeddingCache",
    "QueryEncoderConfig",
    "QueryGroup",
    "QueryTunedEmbeddings",
    "SessionIndex",
    "SessionRankConfig",
    "TurnIndex",
    "TurnRankConfig",
    "encode_queries",
    "finetune_query_encoder",
    "rank_by_best_item",
    "tokenize",
]
