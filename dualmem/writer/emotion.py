"""Emotion scoring and the four emotion-aware reranking strategies of Emotional RAG.

Emotional RAG (Huang et al. 2024, arXiv 2410.23041) gives every memory
fragment and every query an 8-dimension emotion vector (Plutchik: joy,
acceptance, fear, surprise, sadness, disgust, anger, anticipation; 1–10,
scored by the chat model) and ranks memories by meaning *and* mood:

- ``C-A`` — combination by addition: ``semantic + emotional`` similarity;
- ``C-M`` — combination by multiplication: ``semantic * emotional``;
- ``S-S`` — sequential, semantic first: the ``pool`` (20) most similar in
  meaning, reranked by emotional similarity, cut to ``k`` (10);
- ``S-E`` — sequential, emotion first: the ``pool`` most similar in emotion,
  reranked by meaning, cut to ``k``.

Semantic similarity is the cosine of the text embeddings (for unit vectors it
orders exactly like the paper's Euclidean distance); emotional similarity is
the cosine of the emotion vectors. Ties keep the input order. Everything but
:func:`score_emotion` / :func:`ascore_emotion` is a pure function, used by the
``emotional-rag`` baseline and by DualMem's optional ``Settings.tuning.emotion_strategy``.

>>> rank_indices("C-A", [0.9, 0.1], [0.1, 0.95], k=2)
[1, 0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, field_validator

from dualmem.config import setting_default
from dualmem.errors import ConfigurationError
from dualmem.models.structured import Structured, ainvoke_structured, invoke_structured
from dualmem.prompts.emotion import EMOTION_SCORE, EMOTION_SYSTEM
from dualmem.schema import EMOTIONS
from dualmem.vectors import cosine, cosines

STRATEGIES: tuple[str, ...] = ("C-A", "C-M", "S-S", "S-E")
DEFAULT_POOL = 20


def _score_field(name: str) -> Any:
    return Field(ge=1, le=10, description=f"how much {name} the text expresses, 1 (absent) to 10 (overwhelming)")


class EmotionScores(BaseModel):
    """Eight Plutchik emotion scores of a text, each 1–10 (numbers outside are clamped)."""

    joy: float = _score_field("joy")
    acceptance: float = _score_field("acceptance (trust)")
    fear: float = _score_field("fear")
    surprise: float = _score_field("surprise")
    sadness: float = _score_field("sadness")
    disgust: float = _score_field("disgust")
    anger: float = _score_field("anger")
    anticipation: float = _score_field("anticipation")

    @field_validator(*EMOTIONS, mode="before")
    @classmethod
    def _clamp(cls, value: Any) -> Any:
        """Clamp numbers into 1–10 (a model saying 0 for "absent" is not wrong); leave the rest to validation."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return min(max(float(value), 1.0), 10.0)
        return value

    def vector(self) -> list[float]:
        """Return the scores as a vector in the order of ``dualmem.schema.EMOTIONS``."""
        return [float(getattr(self, name)) for name in EMOTIONS]


def emotion_messages(text: str) -> list:
    """Return the chat messages asking for the emotion scores of ``text``."""
    return [SystemMessage(content=EMOTION_SYSTEM), HumanMessage(content=EMOTION_SCORE.format(text=text))]


def score_emotion(
    model: BaseChatModel, text: str, retries: int = setting_default("max_retries"), policy: Any = None
) -> Structured[EmotionScores]:
    """Ask ``model`` for the eight emotion scores of ``text`` (never raises on bad output or a failed call)."""
    return invoke_structured(model, emotion_messages(text), EmotionScores, retries=retries, policy=policy)


async def ascore_emotion(
    model: BaseChatModel, text: str, retries: int = setting_default("max_retries"), policy: Any = None
) -> Structured[EmotionScores]:
    """Async twin of :func:`score_emotion`."""
    return await ainvoke_structured(model, emotion_messages(text), EmotionScores, retries=retries, policy=policy)


def emotion_similarity(query: Sequence[float] | None, item: Sequence[float] | None) -> float:
    """Return the cosine of two emotion vectors (0.0 when either is unknown)."""
    if query is None or item is None:
        return 0.0
    return cosine(query, item)


def check_strategy(strategy: str) -> str:
    """Return ``strategy`` if it is one of C-A, C-M, S-S, S-E; else raise naming the choices."""
    if strategy not in STRATEGIES:
        raise ConfigurationError(
            f"unknown emotion strategy {strategy!r}; use one of {', '.join(STRATEGIES)} "
            "(DUALMEM_EMOTION_STRATEGY / emotion_strategy=)"
        )
    return strategy


def _top(indices: Sequence[int], key: Sequence[float], n: int) -> list[int]:
    """Return the ``n`` indices with the largest ``key``, stable on ties."""
    return sorted(indices, key=lambda i: -key[i])[:n]


def rank_indices(
    strategy: str,
    semantic: Sequence[float],
    emotional: Sequence[float],
    k: int = 10,
    pool: int = DEFAULT_POOL,
) -> list[int]:
    """Return the indices of the ``k`` best items under ``strategy``, best first.

    ``semantic[i]`` and ``emotional[i]`` are item ``i``'s similarities to the
    query in meaning and in emotion. An empty strategy ranks by meaning only.
    """
    if len(semantic) != len(emotional):
        raise ValueError(f"{len(semantic)} semantic scores but {len(emotional)} emotional ones")
    everything = range(len(semantic))
    if not strategy:
        return _top(everything, semantic, k)
    check_strategy(strategy)
    if strategy == "C-A":
        return _top(everything, [s + e for s, e in zip(semantic, emotional, strict=True)], k)
    if strategy == "C-M":
        return _top(everything, [s * e for s, e in zip(semantic, emotional, strict=True)], k)
    if strategy == "S-S":
        return _top(_top(everything, semantic, max(pool, k)), emotional, k)
    return _top(_top(everything, emotional, max(pool, k)), semantic, k)  # S-E


def strategy_score(strategy: str, semantic: float, emotional: float) -> float:
    """Return the score shown for an item ranked by ``strategy`` (its combined or final-stage similarity)."""
    if strategy == "C-A":
        return semantic + emotional
    if strategy == "C-M":
        return semantic * emotional
    if strategy == "S-S":
        return emotional
    return semantic  # S-E and plain semantic ranking


def rerank(
    strategy: str,
    query_vector: Sequence[float],
    query_emotion: Sequence[float] | None,
    vectors: Sequence[Sequence[float]],
    emotions: Sequence[Sequence[float] | None],
    k: int = 10,
    pool: int = DEFAULT_POOL,
) -> list[tuple[int, float]]:
    """Rank items by meaning and emotion; return ``(index, score)`` pairs, best first.

    Without a query emotion the ranking falls back to meaning only.
    """
    return rerank_scored(strategy, cosines(query_vector, vectors), query_emotion, emotions, k=k, pool=pool)


def rerank_scored(
    strategy: str,
    semantic: Sequence[float],
    query_emotion: Sequence[float] | None,
    emotions: Sequence[Sequence[float] | None],
    k: int = 10,
    pool: int = DEFAULT_POOL,
) -> list[tuple[int, float]]:
    """Like :func:`rerank`, given the items' semantic cosines already (from a store's search)."""
    emotional = [emotion_similarity(query_emotion, e) for e in emotions]
    used = strategy if query_emotion is not None else ""
    order = rank_indices(used, semantic, emotional, k=k, pool=pool)
    return [(i, strategy_score(used, semantic[i], emotional[i])) for i in order]


__all__ = [
    "DEFAULT_POOL",
    "STRATEGIES",
    "EmotionScores",
    "ascore_emotion",
    "check_strategy",
    "cosine",
    "cosines",
    "emotion_messages",
    "emotion_similarity",
    "rank_indices",
    "rerank",
    "rerank_scored",
    "score_emotion",
    "strategy_score",
]
