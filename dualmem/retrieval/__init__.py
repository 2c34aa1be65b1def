"""LLM-free retrieval helpers: an embedding cache, BM25, and session-level ranking."""
