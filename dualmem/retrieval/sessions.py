"""LLM-free session ranking: dense turn max-pooling + BM25 + own-session context + time.

A :class:`SessionIndex` grows one session at a time (the RealMem replay adds a
session after its queries were asked) and ranks the sessions it holds for a
query. Only text and order are used — never a dataset's topic labels or gold
fields. The score of a past session ``s`` for a query asked in the current
session is a weighted sum of z-scored features (z over the candidate sessions):

- ``dense``: the best cosine between the query and a user turn of ``s``
  (turn-level max-pooling);
- ``reply``: the same over the assistant turns of ``s`` (when given);
- ``context``: cosine between the centroid of ``s`` and the centroid of the
  user turns already said in the current session before the query (the query
  itself when it opens the session);
- ``bm25``: BM25 of the query plus its own-session context against the whole
  text of ``s`` (user and assistant turns), with statistics of the visible
  sessions only;
- ``thread``: lexical thread affinity — the tf-idf cosine of the query plus
  context with every session, averaged over each session's tf-idf neighbours
  (sessions of one project share rare words even when the query does not);
- ``recency``: ``exp(-age / recency_tau)`` with ``age`` counted in sessions;
- ``propagation``: thread continuity — for the ``propagation_top`` best
  sessions by the features above, the most similar other session (centroid
  cosine), damped by its age, gets a boost: a project's latest session is
  found through its older, better-matching ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dualmem.retrieval.bm25 import BM25, tokenize


@dataclass(frozen=True)
class SessionRankConfig:
    """Weights of the session ranker (coordinate ascent on the 9 RealMem personas: no held-out set)."""

    w_dense: float = field(default=0.5, metadata={"help": "best user-turn cosine in the session"})
    w_reply: float = field(default=1.0, metadata={"help": "best assistant-turn cosine in the session"})
    w_context: float = field(default=0.05, metadata={"help": "session centroid vs own-session context"})
    w_bm25: float = field(default=1.0, metadata={"help": "BM25 of query + context vs session text"})
    w_thread: float = field(default=0.75, metadata={"help": "tf-idf affinity averaged over tf-idf neighbours"})
    w_recency: float = field(default=0.5, metadata={"help": "weight of exp(-age / recency_tau)"})
    recency_tau: float = field(default=22.5, metadata={"help": "recency decay, in sessions"})
    w_propagation: float = field(default=0.5, metadata={"help": "boost of sessions similar to the best ones"})
    propagation_tau: float = field(default=10.0, metadata={"help": "age decay of the propagation boost"})
    propagation_top: int = field(default=3, metadata={"help": "how many best sessions propagate"})
    bm25_k1: float = field(default=1.2, metadata={"help": "BM25 k1"})
    bm25_b: float = field(default=0.3, metadata={"help": "BM25 b (low: long sessions are not penalised)"})


def zscore(values: np.ndarray) -> np.ndarray:
    """Return ``values`` standardised to mean 0 and deviation 1 (zeros when constant)."""
    if len(values) < 2:
        return np.zeros_like(values, dtype=float)
    sd = values.std()
    return (values - values.mean()) / sd if sd > 0 else np.zeros_like(values, dtype=float)


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


class SessionIndex:
    """Past sessions, added in order, ranked for a query without any LLM."""

    def __init__(self, dims: int, config: SessionRankConfig | None = None) -> None:
        self.config = config or SessionRankConfig()
        self.dims = dims
        self.ids: list[str] = []
        self._unit_vectors: list[np.ndarray] = []
        self._unit_session: list[int] = []
        self._reply_vectors: list[np.ndarray] = []
        self._reply_session: list[int] = []
        self._centroids: list[np.ndarray] = []
        self._bm25 = BM25(k1=self.config.bm25_k1, b=self.config.bm25_b)
        self._stacked: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._replies: tuple[np.ndarray, np.ndarray] | None = None
        self._neighbours: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, session_id: str, unit_vectors: np.ndarray, text: str, reply_vectors: np.ndarray | None = None) -> None:
        """Add a session: unit vectors of its user turns, its whole text, and optionally of its assistant turns."""
        index = len(self.ids)
        if reply_vectors is not None:
            replies = np.asarray(reply_vectors, dtype=np.float32).reshape(-1, self.dims)
            self._reply_vectors.append(replies)
            self._reply_session.extend([index] * len(replies))
        self.ids.append(session_id)
        vectors = np.asarray(unit_vectors, dtype=np.float32).reshape(-1, self.dims)
        self._unit_vectors.append(vectors)
        self._unit_session.extend([index] * len(vectors))
        self._centroids.append(_unit(vectors.mean(axis=0)) if len(vectors) else np.zeros(self.dims, np.float32))
        self._bm25.add([tokenize(text)])
        self._stacked = self._replies = self._neighbours = None

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._stacked is None:
            units = np.concatenate(self._unit_vectors) if self._unit_vectors else np.zeros((0, self.dims), np.float32)
            self._stacked = (units, np.asarray(self._unit_session, dtype=int), np.stack(self._centroids))
        return self._stacked

    def _reply_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._replies is None:
            units = np.concatenate(self._reply_vectors) if self._reply_vectors else np.zeros((0, self.dims), np.float32)
            self._replies = (units, np.asarray(self._reply_session, dtype=int))
        return self._replies

    def _thread_neighbours(self) -> np.ndarray:
        """Row-normalised tf-idf cosine between sessions (no self-similarity), rebuilt once per added session."""
        if self._neighbours is None:
            tfidf = self._bm25.tfidf()
            sims = (tfidf @ tfidf.T).toarray()
            np.fill_diagonal(sims, 0.0)
            self._neighbours = sims / (sims.sum(axis=1, keepdims=True) + 1e-9)
        return self._neighbours

    def scores(
        self,
        query: str,
        query_vector: np.ndarray,
        context: str = "",
        context_vectors: np.ndarray | None = None,
    ) -> np.ndarray:
        """Return one score per indexed session (higher is better)."""
        n = len(self.ids)
        if n == 0:
            return np.zeros(0)
        cfg = self.config
        units, owner, centroids = self._arrays()
        qv = _unit(np.asarray(query_vector, dtype=np.float32))
        dense = np.full(n, -1.0)
        if len(units):
            np.maximum.at(dense, owner, units @ qv)
        if context_vectors is not None and len(context_vectors):
            cv = _unit(np.asarray(context_vectors, dtype=np.float32).mean(axis=0))
        else:
            cv = qv
        score = cfg.w_dense * zscore(dense) + cfg.w_context * zscore(centroids @ cv)
        replies, reply_owner = self._reply_arrays()
        if cfg.w_reply and len(replies):
            reply = np.full(n, -1.0)
            np.maximum.at(reply, reply_owner, replies @ qv)
            score = score + cfg.w_reply * zscore(reply)
        tokens = tokenize(f"{query} {context}")
        if cfg.w_bm25:
            score = score + cfg.w_bm25 * zscore(self._bm25.scores(tokens))
        if cfg.w_thread and n > 1:
            score = score + cfg.w_thread * zscore(self._thread_neighbours() @ self._bm25.tfidf_query(tokens))
        age = n - np.arange(n)
        if cfg.w_recency:
            score = score + cfg.w_recency * np.exp(-age / cfg.recency_tau)
        if cfg.w_propagation and n > 1:
            top = np.argsort(-score)[: cfg.propagation_top]
            sims = centroids @ centroids[top].T  # n x top
            sims[top, np.arange(len(top))] = 0.0  # a session does not propagate to itself
            score = score + cfg.w_propagation * zscore(sims.max(axis=1) * np.exp(-age / cfg.propagation_tau))
        return score

    def rank(
        self,
        query: str,
        query_vector: np.ndarray,
        context: str = "",
        context_vectors: np.ndarray | None = None,
        k: int | None = None,
    ) -> list[tuple[str, float]]:
        """Return ``(session id, score)`` best first (all sessions unless ``k``)."""
        score = self.scores(query, query_vector, context, context_vectors)
        order = np.argsort(-score, kind="stable")
        if k is not None:
            order = order[:k]
        return [(self.ids[i], float(score[i])) for i in order]


def rank_by_best_item(session_ids: Sequence[str | None], scores: Sequence[float]) -> list[str]:
    """Rank sessions by their best item (items given best first or with scores): max-pooling."""
    best: dict[str, float] = {}
    for sid, score in zip(session_ids, scores, strict=True):
        if sid is not None and (sid not in best or score > best[sid]):
            best[sid] = float(score)
    return sorted(best, key=lambda s: -best[s])
