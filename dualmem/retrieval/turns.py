"""LLM-free turn ranking: dense + BM25 per turn, smoothed over neighbours and sessions.

A :class:`TurnIndex` holds the turns of one conversation in order and ranks
them for a question. Features (z-scored over all turns, weighted sum):

- ``dense``: cosine between the question and the turn;
- ``bm25``: BM25 of the question against ``speaker: text`` of the turn
  (questions name the speaker: "When did Caroline ...");
- ``window``: cosine and BM25 of the question against the turn joined with
  its two neighbours in the same session (the answer may be split over turns);
- ``neighbour``: the best of the two adjacent turns' dense+BM25 scores in the
  same session — an answer often sits next to the turn that matches the words;
- ``session``: the session's best turn score plus its BM25 as a whole —
  relevant sessions lift all their turns;
- ``speaker``: a bonus for turns spoken by the person the question names.

The question's dense vector is best taken from :func:`dense_question`: the
question with the speakers' names removed (people rarely say their own name,
so the name only pulls the question vector away from the turns it asks about;
the ``speaker`` feature uses the name instead).

``max_per_session`` caps how many turns one session may place in the top
``k`` (questions whose evidence spans sessions gain).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dualmem.retrieval.bm25 import BM25, tokenize
from dualmem.retrieval.sessions import zscore


def dense_question(question: str, speakers: Sequence[str]) -> str:
    """Return ``question`` without the names of ``speakers`` (and their possessive), for its dense vector.

    >>> dense_question("When did Caroline's sister visit Melanie?", ["Caroline", "Melanie"])
    'When did sister visit ?'
    """
    out = question
    for name in sorted({s for s in speakers if s}, key=len, reverse=True):
        out = re.sub(rf"\b{re.escape(name)}(?:'s)?\b", "", out, flags=re.IGNORECASE)
    out = re.sub(r"\s+", " ", out).strip()
    return out or question


@dataclass(frozen=True)
class TurnRankConfig:
    """Weights of the turn ranker (defaults tuned on the 10 LoCoMo conversations: no held-out set)."""

    w_dense: float = field(default=1.0, metadata={"help": "question-turn cosine"})
    w_bm25: float = field(default=0.3, metadata={"help": "BM25 of the question vs 'speaker: text'"})
    w_window: float = field(default=0.15, metadata={"help": "cosine vs the turn's 3-turn window"})
    w_window_bm25: float = field(default=0.15, metadata={"help": "BM25 vs the turn's 3-turn window"})
    w_neighbour: float = field(default=0.55, metadata={"help": "best adjacent turn's score"})
    w_session: float = field(default=1.0, metadata={"help": "session-level score (best turn + session BM25)"})
    w_speaker: float = field(default=5.0, metadata={"help": "bonus for turns whose speaker the question names"})
    max_per_session: int = field(default=0, metadata={"help": "at most this many turns per session (0: no cap)"})
    bm25_k1: float = field(default=1.2, metadata={"help": "BM25 k1"})
    bm25_b: float = field(default=0.3, metadata={"help": "BM25 b"})


class TurnIndex:
    """The turns of one conversation, ranked for a question without any LLM."""

    def __init__(
        self,
        turn_ids: Sequence[str],
        session_ids: Sequence[str],
        texts: Sequence[str],
        vectors: np.ndarray,
        config: TurnRankConfig | None = None,
        speakers: Sequence[str] | None = None,
    ) -> None:
        if not (len(turn_ids) == len(session_ids) == len(texts) == len(vectors)):
            raise ValueError("turn_ids, session_ids, texts and vectors must have the same length")
        self.config = config or TurnRankConfig()
        self.turn_ids = list(turn_ids)
        self.session_ids = list(session_ids)
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.speakers = [s.lower() for s in speakers] if speakers is not None else None
        cfg = self.config
        self._bm25 = BM25([tokenize(t) for t in texts], k1=cfg.bm25_k1, b=cfg.bm25_b)
        sessions = list(dict.fromkeys(self.session_ids))
        self._session_of = np.asarray([sessions.index(s) for s in self.session_ids])
        joined = [" ".join(t for t, s in zip(texts, self.session_ids, strict=True) if s == sid) for sid in sessions]
        self._session_bm25 = BM25([tokenize(t) for t in joined], k1=cfg.bm25_k1, b=0.75)
        same_prev = np.r_[False, self._session_of[1:] == self._session_of[:-1]]
        self._has_prev = same_prev
        self._has_next = np.r_[same_prev[1:], False]
        window = self.vectors.copy()
        window[1:][same_prev[1:]] += self.vectors[:-1][same_prev[1:]]
        window[:-1][self._has_next[:-1]] += self.vectors[1:][self._has_next[:-1]]
        norms = np.linalg.norm(window, axis=1, keepdims=True)
        self._window_vectors = window / np.where(norms > 0, norms, 1.0)
        tokens = [tokenize(t) for t in texts]
        self._window_bm25 = BM25(
            [
                (tokens[i - 1] if same_prev[i] else []) + tokens[i] + (tokens[i + 1] if self._has_next[i] else [])
                for i in range(len(tokens))
            ],
            k1=cfg.bm25_k1,
            b=0.75,
        )

    def __len__(self) -> int:
        return len(self.turn_ids)

    def scores(self, question: str, question_vector: np.ndarray) -> np.ndarray:
        """Return one score per turn (higher is better)."""
        cfg = self.config
        q = np.asarray(question_vector, dtype=np.float32)
        tokens = tokenize(question)
        base = cfg.w_dense * zscore(self.vectors @ q) + cfg.w_bm25 * zscore(self._bm25.scores(tokens))
        if cfg.w_window:
            base += cfg.w_window * zscore(self._window_vectors @ q)
        if cfg.w_window_bm25:
            base += cfg.w_window_bm25 * zscore(self._window_bm25.scores(tokens))
        score = base.copy()
        if cfg.w_neighbour:
            low = np.full(len(base), base.min() if len(base) else 0.0)
            prev = np.where(self._has_prev, np.r_[low[:1], base[:-1]], low)
            nxt = np.where(self._has_next, np.r_[base[1:], low[:1]], low)
            score += cfg.w_neighbour * zscore(np.maximum(prev, nxt))
        if cfg.w_session:
            n_sessions = int(self._session_of.max()) + 1 if len(base) else 0
            best = np.full(n_sessions, -np.inf)
            np.maximum.at(best, self._session_of, base)
            session_score = zscore(best) + zscore(self._session_bm25.scores(tokens))
            score += cfg.w_session * zscore(session_score[self._session_of])
        if cfg.w_speaker and self.speakers is not None:
            words = set(question.lower().replace("'s", " ").replace("?", " ").split())
            named = np.asarray([sp in words for sp in self.speakers], dtype=float)
            if 0 < named.sum() < len(named):
                score += cfg.w_speaker * named
        return score

    def rank(self, question: str, question_vector: np.ndarray, k: int = 10) -> list[tuple[str, float]]:
        """Return the ``k`` best ``(turn id, score)``, best first."""
        score = self.scores(question, question_vector)
        order = np.argsort(-score, kind="stable")
        cap = self.config.max_per_session
        if cap:
            taken: dict[int, int] = {}
            picked = []
            for i in order:
                sess = int(self._session_of[i])
                if taken.get(sess, 0) < cap:
                    taken[sess] = taken.get(sess, 0) + 1
                    picked.append(i)
                    if len(picked) == k:
                        break
            order = np.asarray(picked, dtype=int)
        order = order[:k]
        return [(self.turn_ids[i], float(score[i])) for i in order]
