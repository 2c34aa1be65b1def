"""The two option objects a deployment carries: :class:`Tuning` (how memory is written and ranked) and
:class:`EvalOptions` (how ``dualmem eval`` runs and judges). Their defaults live here and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass

from dualmem.config._fields import _check, _Options, _setting


@dataclass(frozen=True)
class Tuning(_Options):
    """How memory is written and ranked: chunking, the writer's view, retrieval, generation and repair."""

    chunk_tokens: int = _setting(1024, "writer chunk size in tokens (cut at turn boundaries)", int)
    view_k: int = _setting(8, "facts and insights recalled into the writer's working view", int)
    view_recent: int = _setting(4, "most recent items always shown in the working view", int)
    max_ops_per_chunk: int = _setting(
        40, "writer operations accepted per chunk; the rest are rejected with a reason", int
    )
    dedup_threshold: float = _setting(0.92, "cosine above which a new fact merges into an old one", float)
    search_mode: str = _setting(
        "hybrid",
        "store search of the writer's working view (what memory the writer sees beside a chunk): "
        "hybrid (vector + full text, RRF), vector or fts",
    )
    retrieval_k: int = _setting(10, "facts and insights retrieved per query", int)
    retrieval_mode: str = _setting(
        "dual", "dual (ceil(k/2) facts + floor(k/2) insights) or merged (one top-k pool of both)"
    )
    ranker: str = _setting(
        "learned",
        "retrieval ranker of raw-turns, dualmem, the retriever, respond and the tools: learned (features fused by the "
        "weights shipped with dualmem), vector, hybrid or fts (plain store search), or a weights file from dualmem.retrieval.fit",
    )
    ranker_max_per_session: int = _setting(
        -1, "items of one session the ranked list holds before other sessions' (0: no cap; -1: the ranker's own)", int
    )
    ranker_context_turns: int = _setting(
        8, "recent conversation turns the learned ranker reads as the query's context", int
    )
    emotion_strategy: str = _setting(
        "", "emotion-aware reranking: C-A, C-M, S-S, S-E or empty (dualmem: none; emotional-rag: C-A)"
    )
    temperature: float = _setting(0.0, "sampling temperature of chat models", float)
    max_new_tokens: int = _setting(512, "generation limit per call (local model and OpenAI-compatible endpoints)", int)
    max_retries: int = _setting(2, "repair retries for malformed structured output", int)
    retry_backoff: float = _setting(
        1.0, "first wait before retrying a model call, in seconds; doubles each retry (with jitter)", float
    )
    retry_max_wait: float = _setting(
        120.0, "longest wait between model-call retries, in seconds; a longer Retry-After fails the call instead", float
    )
    formation_idle_s: float = _setting(
        300.0,
        "seconds a chat thread stays quiet before its pending turns shorter than a chunk are written (each new message postpones it)",
        float,
    )

    def __post_init__(self) -> None:
        choices = {
            "retrieval_mode": ("dual", "merged"),
            "search_mode": ("hybrid", "vector", "fts"),
            "emotion_strategy": ("", "C-A", "C-M", "S-S", "S-E"),
        }
        at_least = dict.fromkeys(("chunk_tokens", "view_k", "retrieval_k", "max_ops_per_chunk"), 1)
        at_least |= dict.fromkeys(
            ("max_retries", "retry_backoff", "retry_max_wait", "formation_idle_s", "ranker_context_turns"), 0
        )
        _check(self, choices, at_least | {"ranker_max_per_session": -1})


@dataclass(frozen=True)
class EvalOptions(_Options):
    """How ``dualmem eval`` runs and judges: the framework under test, judges, baselines' windows, fan-out, prices."""

    framework: str = _setting("dualmem", "memory framework used by eval and the respond graph")
    judge_model: str = _setting("", "model of the LLM judges; empty = chat_model")
    judge_repetitions: int = _setting(
        3, "times each role-play judge scores an answer (averaged; RealMem and LoCoMo judges ask once)", int
    )
    judge_leniency_max: float = _setting(
        0.2,
        "false-accept rate of a calibrated judge (dualmem eval --calibrate-judge) above which reports warn that its "
        "scores overstate quality",
        float,
    )
    calibration_queries: int = _setting(
        20, "gold answers per persona that judge calibration perturbs into wrong and faithful answers", int
    )
    eval_embedder: str = _setting(
        "", "embedder of similarity metrics (Recall@10); empty = embedder (paper: Qwen3-Embedding-0.6B)"
    )
    context_tokens: int = _setting(8000, "history window of the full-context baseline, in tokens", int)
    incharacter_dir: str = _setting(
        "../shared/data/incharacter", "InCharacter questionnaires, characters and labels (eval personality)"
    )
    concurrency: int = _setting(
        4, "bounded fan-out of graph branches (dualmem eval: persona x framework units in flight, cluster-wide)", int
    )
    prices: str = _setting(
        "",
        "price table turning tokens into money in cost reports: MODEL=IN/OUT per million input/output tokens, "
        "comma-separated (* = any model); empty = tokens only",
    )

    def __post_init__(self) -> None:
        at_least = dict.fromkeys(("judge_repetitions", "calibration_queries", "concurrency"), 1)
        _check(self, {}, at_least | {"judge_leniency_max": 0})
