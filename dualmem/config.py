"""One settings object for every run.

Precedence is per-run > environment > default, resolved here and nowhere
else: each field's default reads ``DUALMEM_<FIELD>`` (upper case) from the
environment when the object is made, and keyword arguments override both.
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` are read under their usual names.

>>> Settings(retrieval_k=5).retrieval_k
5
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import Any

from dualmem.errors import ConfigurationError

ENV_PREFIX = "DUALMEM_"
# fields read from a non-prefixed, conventional environment variable
STORE_SCHEMES = ("file", "memory", "s3", "s3+ddb", "gs", "az", "abfs", "abfss", "oss", "cos", "hf", "db")
"""URI schemes a ``store_uri`` may use (LanceDB's object stores); anything else is a local folder."""
# the memory writer of a bundled chat model when writer_model is empty: its SFT LoRA (README "Training the writer")
BUNDLED_WRITER = {"local:smollm2": "local:smollm2-writer"}
DEFAULT_USER = "user"
"""Whose memory a write goes to when no user is set anywhere (see :func:`dualmem.auth.whose_memory`)."""
ENV_ALIASES = {"openai_base_url": "OPENAI_BASE_URL", "openai_api_key": "OPENAI_API_KEY"}


def _env(name: str, default: Any, kind: type) -> Any:
    var = ENV_ALIASES.get(name, ENV_PREFIX + name.upper())
    raw = os.environ.get(var)
    if raw is None or raw == "":
        return default
    try:
        if kind is bool:
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{var}={raw!r} is not a valid {kind.__name__}; fix or unset it") from exc
    return raw


def _setting(default: Any, help: str, kind: type = str) -> Any:
    """Declare a field whose default is overridden by its environment variable."""
    holder: dict[str, str] = {}

    def factory() -> Any:
        return _env(holder["name"], default, kind)

    return field(default_factory=factory, metadata={"help": help, "env_default": default, "holder": holder})


@dataclass(frozen=True)
class Settings:
    """Run settings for models, store, chunking and retrieval."""

    chat_model: str = _setting("local:smollm2", "chat model as provider:model (local:smollm2 is bundled)")
    writer_model: str = _setting(
        "",
        "model of the memory writer; empty = chat_model (local:smollm2 writes with its SFT adapter "
        "local:smollm2-writer unless local_engine=llama.cpp)",
    )
    judge_model: str = _setting("", "model of the LLM judges; empty = chat_model")
    judge_repetitions: int = _setting(
        3, "times each role-play judge scores an answer (averaged; RealMem and LoCoMo judges ask once)", int
    )
    openai_base_url: str = _setting("", "base URL of an OpenAI-compatible endpoint (vLLM, DeepSeek…)")
    openai_api_key: str = _setting("", "API key for that endpoint")
    embedder: str = _setting(
        "bundled:all-MiniLM-L6-v2",
        "embedder: bundled:all-MiniLM-L6-v2, a sentence-transformers path, or provider:model",
    )
    eval_embedder: str = _setting(
        "", "embedder of similarity metrics (Recall@10); empty = embedder (paper: Qwen3-Embedding-0.6B)"
    )
    store_uri: str = _setting(".dualmem/lancedb", "LanceDB directory or URI (s3://…, gs://…)")
    store_options: str = _setting(
        "", "LanceDB storage options as a JSON object (object stores: endpoint, region…); AWS_* variables work too"
    )
    memory_label: str = _setting(
        "dualmem", "first namespace label under which the LangGraph store shows facts and insights"
    )
    lease_ttl_s: float = _setting(
        60.0, "seconds a writer's namespace lease lasts unrenewed (a killed writer's lease frees after it)", float
    )
    lease_wait_s: float = _setting(
        900.0, "seconds a writer waits for another writer of the same namespace before failing", float
    )
    checkpoint_path: str = _setting(".dualmem/checkpoints.sqlite", "SQLite checkpointer file")
    user_id: str = _setting(
        "",
        "user id: second part of every memory namespace; empty = readers take the persona's only user, writers "
        f"'{DEFAULT_USER}' (on a server with authentication: always the authenticated user)",
    )
    chunk_tokens: int = _setting(1024, "writer chunk size in tokens (cut at turn boundaries)", int)
    context_tokens: int = _setting(8000, "history window of the full-context baseline, in tokens", int)
    view_k: int = _setting(8, "facts and insights recalled into the writer's working view", int)
    view_recent: int = _setting(4, "most recent items always shown in the working view", int)
    retrieval_k: int = _setting(10, "facts and insights retrieved per query", int)
    retrieval_mode: str = _setting(
        "dual", "dual (ceil(k/2) facts + floor(k/2) insights) or merged (one top-k pool of both)"
    )
    search_mode: str = _setting(
        "hybrid",
        "store search of the writer's working view (what memory the writer sees beside a chunk): "
        "hybrid (vector + full text, RRF), vector or fts",
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
    framework: str = _setting("dualmem", "memory framework used by eval and the respond graph")
    incharacter_dir: str = _setting(
        "../shared/data/incharacter", "InCharacter questionnaires, characters and labels (eval personality)"
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
    prices: str = _setting(
        "",
        "price table turning tokens into money in cost reports: MODEL=IN/OUT per million input/output tokens, "
        "comma-separated (* = any model); empty = tokens only",
    )
    max_retries: int = _setting(2, "repair retries for malformed structured output", int)
    call_retries: int = _setting(
        4, "retries of a model call that failed transiently (429, 5xx, timeout, refused connection)", int
    )
    retry_backoff: float = _setting(
        1.0, "first wait before retrying a model call, in seconds; doubles each retry (with jitter)", float
    )
    retry_max_wait: float = _setting(
        120.0, "longest wait between model-call retries, in seconds; a longer Retry-After fails the call instead", float
    )
    request_timeout: float = _setting(
        120.0, "seconds before a call to a remote model endpoint times out (a transient error; 0 = no limit)", float
    )
    max_ops_per_chunk: int = _setting(
        40, "writer operations accepted per chunk; the rest are rejected with a reason", int
    )
    temperature: float = _setting(0.0, "sampling temperature of chat models", float)
    max_new_tokens: int = _setting(512, "generation limit per call (local model and OpenAI-compatible endpoints)", int)
    local_engine: str = _setting(
        "auto", "runtime of local: models: auto (llama.cpp when installed), llama.cpp, transformers"
    )
    concurrency: int = _setting(
        4, "bounded fan-out of graph branches (dualmem eval: persona x framework units in flight, cluster-wide)", int
    )
    ray_address: str = _setting(
        "",
        "Ray cluster of dualmem eval and batch ingest (auto, local, HOST:PORT or ray://HOST:10001); empty = threads of this process",
    )
    endpoint_concurrency: int = _setting(
        32, "model calls in flight per endpoint, shared by every node of a Ray run (0 = no limit)", int
    )
    endpoint_rpm: int = _setting(
        0, "model calls started per minute per endpoint, shared by every node of a Ray run (0 = no limit)", int
    )
    dedup_threshold: float = _setting(0.92, "cosine above which a new fact merges into an old one", float)
    formation: str = _setting(
        "auto",
        "where chat memory is formed: auto (scheduled write runs on the LangGraph server the chat runs on, "
        "else a background executor in this process), local or server",
    )
    formation_idle_s: float = _setting(
        300.0,
        "seconds a chat thread stays quiet before its pending turns shorter than a chunk are written (each new message postpones it)",
        float,
    )
    formation_url: str = _setting(
        "",
        "LangGraph server whose write graph forms chat memory (formation=server or auto); empty = the server the chat runs on",
    )

    def __post_init__(self) -> None:
        choices = {
            "retrieval_mode": ("dual", "merged"),
            "search_mode": ("hybrid", "vector", "fts"),
            "emotion_strategy": ("", "C-A", "C-M", "S-S", "S-E"),
            "local_engine": ("auto", "llama.cpp", "transformers"),
            "formation": ("auto", "local", "server"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigurationError(
                    f"setting {name}={getattr(self, name)!r} is not one of {allowed}; "
                    f"set {ENV_PREFIX}{name.upper()} or pass {name}= to one of them"
                )
        positive = ("chunk_tokens", "view_k", "retrieval_k", "concurrency", "judge_repetitions", "max_ops_per_chunk")
        for name in (*positive, "calibration_queries"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"setting {name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "max_retries",
            "call_retries",
            "retry_backoff",
            "retry_max_wait",
            "request_timeout",
            "formation_idle_s",
            "ranker_context_turns",
            "endpoint_concurrency",
            "endpoint_rpm",
            "judge_leniency_max",
        ):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"setting {name} must be >= 0, got {getattr(self, name)}")
        if self.ranker_max_per_session < -1:
            raise ConfigurationError(f"setting ranker_max_per_session must be >= -1, got {self.ranker_max_per_session}")

    @property
    def writer(self) -> str:
        """Return the spec of the model that writes memory when no chat model object is given (see :meth:`writer_for`)."""
        return self.writer_for(chat_given=False) or self.chat_model

    def writer_for(self, chat_given: bool = False) -> str | None:
        """Decide who writes memory — the one rule: ``writer_model`` when set; else a chat model object handed over
        (``chat_given``) writes too (None); else ``chat_model``, whose bundled model writes with its SFT adapter
        (``local:smollm2`` -> ``local:smollm2-writer``) unless ``local_engine`` is llama.cpp, which cannot apply it."""
        if self.writer_model:
            return self.writer_model
        if chat_given:
            return None
        if self.local_engine == "llama.cpp":
            return self.chat_model
        return BUNDLED_WRITER.get(self.chat_model, self.chat_model)

    @property
    def user(self) -> str:
        """Return the user a writer with no user named writes for: ``user_id`` when set, else ``DEFAULT_USER``."""
        return self.user_id or DEFAULT_USER

    @property
    def judge(self) -> str:
        """Return the judge model spec (falls back to ``chat_model``)."""
        return self.judge_model or self.chat_model

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied (unknown names raise)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigurationError(f"unknown settings {sorted(unknown)}; see `dualmem --help` or the README table")
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        """Return the names of every setting."""
        return [f.name for f in fields(cls)]

    @classmethod
    def resolve(cls, settings: Settings | dict[str, Any] | None = None, **overrides: Any) -> Settings:
        """Build settings from an object, a dict (e.g. a graph's context) or overrides."""
        if isinstance(settings, Settings):
            base = settings
        else:
            base = cls()
            if settings:
                overrides = {**{k: v for k, v in settings.items() if v is not None}, **overrides}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        return base.replace(**overrides) if overrides else base


def _bind_field_names() -> None:
    for f in fields(Settings):
        holder = f.metadata.get("holder")
        if holder is not None:
            holder["name"] = f.name


_bind_field_names()


def setting_default(name: str) -> Any:
    """Return the code default of setting ``name`` (not its environment override): for signatures and run configs
    that must agree with ``Settings`` instead of repeating its value.

    >>> setting_default("chunk_tokens")
    1024
    """
    for f in fields(Settings):
        if f.name == name:
            return f.metadata["env_default"]
    raise KeyError(f"no setting {name!r}")


def settings_table() -> list[tuple[str, str, str, str]]:
    """Return (field, env var, default, help) rows, as documented in the README."""
    rows = []
    for f in fields(Settings):
        var = ENV_ALIASES.get(f.name, ENV_PREFIX + f.name.upper())
        rows.append((f.name, var, repr(f.metadata["env_default"]), f.metadata["help"]))
    return rows


__all__ = ["DEFAULT_USER", "Settings", "setting_default", "settings_table"]
