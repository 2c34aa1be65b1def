"""Settings: one object for a deployment, two for what it tunes and evaluates.

:class:`Settings` holds what a deployment decides — the store, the models and
their endpoint, the user, limits. :class:`Tuning` holds how memory is written
and ranked, :class:`EvalOptions` how ``dualmem eval`` judges it; a settings
object carries one of each (``settings.tuning``, ``settings.evaluation``).

Invariants:

- every setting has one name, unique across the three objects: the same name is
  its keyword (``Settings(chunk_tokens=512)`` routes it to ``tuning``), its
  ``--set`` name and its environment variable ``DUALMEM_<NAME>``;
- precedence is per-run > environment > default, resolved here and nowhere
  else: each field's default reads its environment variable when the object is
  made, and keyword arguments override both (``OPENAI_BASE_URL`` and
  ``OPENAI_API_KEY`` are read under their usual names);
- defaults live only in this module (:func:`setting_default` reads them).

>>> Settings(retrieval_k=5).tuning.retrieval_k
5
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from dualmem.config._fields import ENV_ALIASES, ENV_PREFIX, _check, _setting
from dualmem.config.options import EvalOptions, Tuning
from dualmem.errors import ConfigurationError

STORE_SCHEMES = ("file", "memory", "s3", "s3+ddb", "gs", "az", "abfs", "abfss", "oss", "cos", "hf", "db")
"""URI schemes a ``store_uri`` may use (LanceDB's object stores); anything else is a local folder."""
# the memory writer of a bundled chat model when writer_model is empty: its SFT LoRA (README "Training the writer")
BUNDLED_WRITER = {"local:smollm2": "local:smollm2-writer"}
DEFAULT_USER = "user"
"""Whose memory a write goes to when no user is set anywhere (see :func:`dualmem.auth.whose_memory`)."""


@dataclass(frozen=True, init=False)
class Settings:
    """A deployment's settings — store, models, endpoint, user, limits — with its :class:`Tuning` and
    :class:`EvalOptions`.

    Any setting's name is a keyword here (``Settings(store_uri="db", chunk_tokens=512)``), in :meth:`replace` and in
    :meth:`resolve`: each goes to the object that holds it. Read a tuning or evaluation setting where it lives
    (``settings.tuning.chunk_tokens``): read off the settings object itself it raises ``AttributeError`` naming that
    place.
    """

    chat_model: str = _setting("local:smollm2", "chat model as provider:model (local:smollm2 is bundled)")
    writer_model: str = _setting(
        "",
        "model of the memory writer; empty = chat_model (local:smollm2 writes with its SFT adapter "
        "local:smollm2-writer unless local_engine=llama.cpp)",
    )
    local_engine: str = _setting(
        "auto", "runtime of local: models: auto (llama.cpp when installed), llama.cpp, transformers"
    )
    openai_base_url: str = _setting("", "base URL of an OpenAI-compatible endpoint (vLLM, DeepSeek…)")
    openai_api_key: str = _setting("", "API key for that endpoint (never shown in the settings' repr)", secret=True)
    request_timeout: float = _setting(
        120.0, "seconds before a call to a remote model endpoint times out (a transient error; 0 = no limit)", float
    )
    call_retries: int = _setting(
        4, "retries of a model call that failed transiently (429, 5xx, timeout, refused connection)", int
    )
    endpoint_concurrency: int = _setting(
        32, "model calls in flight per endpoint, shared by every node of a Ray run (0 = no limit)", int
    )
    endpoint_rpm: int = _setting(
        0, "model calls started per minute per endpoint, shared by every node of a Ray run (0 = no limit)", int
    )
    embedder: str = _setting(
        "bundled:all-MiniLM-L6-v2",
        "embedder: bundled:all-MiniLM-L6-v2, a sentence-transformers path, or provider:model",
    )
    store_uri: str = _setting(".dualmem/lancedb", "LanceDB directory or URI (s3://…, gs://…)")
    store_options: str = _setting(
        "", "LanceDB storage options as a JSON object (object stores: endpoint, region…); AWS_* variables work too"
    )
    memory_label: str = _setting(
        "dualmem", "first namespace label under which the LangGraph store shows facts and insights"
    )
    checkpoint_path: str = _setting(".dualmem/checkpoints.sqlite", "SQLite checkpointer file")
    user_id: str = _setting(
        "",
        "user id: second part of every memory namespace; empty = readers take the persona's only user, writers "
        f"'{DEFAULT_USER}' (on a server with authentication: always the authenticated user)",
    )
    lease_ttl_s: float = _setting(
        60.0, "seconds a writer's namespace lease lasts unrenewed (a killed writer's lease frees after it)", float
    )
    lease_wait_s: float = _setting(
        900.0, "seconds a writer waits for another writer of the same namespace before failing", float
    )
    formation: str = _setting(
        "auto",
        "where chat memory is formed: auto (scheduled write runs on the LangGraph server the chat runs on, "
        "else a background executor in this process), local or server",
    )
    formation_url: str = _setting(
        "",
        "LangGraph server whose write graph forms chat memory (formation=server or auto); empty = the server the chat runs on",
    )
    ray_address: str = _setting(
        "",
        "Ray cluster of dualmem eval and batch ingest (auto, local, HOST:PORT or ray://HOST:10001); empty = threads of this process",
    )
    tuning: Tuning = field(default_factory=Tuning, metadata={"group": True})
    evaluation: EvalOptions = field(default_factory=EvalOptions, metadata={"group": True})

    def __init__(self, tuning: Tuning | None = None, evaluation: EvalOptions | None = None, **values: Any) -> None:
        mine, tune, judge = _route(values)
        for f in _own_fields():
            object.__setattr__(self, f.name, mine[f.name] if f.name in mine else f.default_factory())  # type: ignore[misc,operator]
        object.__setattr__(self, "tuning", tuning.replace(**tune) if tuning else Tuning(**tune))
        object.__setattr__(self, "evaluation", evaluation.replace(**judge) if evaluation else EvalOptions(**judge))
        _check(
            self,
            {"local_engine": ("auto", "llama.cpp", "transformers"), "formation": ("auto", "local", "server")},
            dict.fromkeys(("call_retries", "request_timeout", "endpoint_concurrency", "endpoint_rpm"), 0),
        )

    if not TYPE_CHECKING:  # mypy keeps flagging unknown attributes

        def __getattr__(self, name: str) -> Any:
            """An unknown attribute raises AttributeError; for a tuning or evaluation setting it names the setting's
            place (``settings.tuning.chunk_tokens``)."""
            group = "tuning" if name in GROUPS["tuning"] else "evaluation" if name in GROUPS["evaluation"] else None
            where = f"; it is settings.{group}.{name}" if group else ""
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{where}")

    @property
    def writer(self) -> str:
        """Return the spec of the model that writes memory when no chat model object is given (see :meth:`writer_for`)."""
        return self.writer_for(chat_given=False) or self.chat_model

    def writer_for(self, chat_given: bool = False) -> str | None:
        """Decide who writes memory — the one rule: ``writer_model`` when set; else a chat model object handed over
        (``chat_given``) writes too (None); else ``chat_model``, whose bundled model writes with its SFT adapter
        (``local:smollm2`` -> ``local:smollm2-writer``), on either local engine."""
        if self.writer_model:
            return self.writer_model
        if chat_given:
            return None
        return BUNDLED_WRITER.get(self.chat_model, self.chat_model)

    @property
    def user(self) -> str:
        """Return the user a writer with no user named writes for: ``user_id`` when set, else ``DEFAULT_USER``."""
        return self.user_id or DEFAULT_USER

    @property
    def judge(self) -> str:
        """Return the judge model spec (falls back to ``chat_model``)."""
        return self.evaluation.judge_model or self.chat_model

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied, any setting by its name (unknown names raise)."""
        mine, tune, judge = _route(changes)
        return dataclasses.replace(
            self, **mine, tuning=self.tuning.replace(**tune), evaluation=self.evaluation.replace(**judge)
        )

    def flat(self) -> dict[str, Any]:
        """Return every setting by its name (what run records, ``--set`` and the environment use)."""
        values = {f.name: getattr(self, f.name) for f in _own_fields()}
        for group in GROUPS:
            values |= {f.name: getattr(getattr(self, group), f.name) for f in fields(getattr(self, group))}
        return values

    @classmethod
    def field_names(cls) -> list[str]:
        """Return the names of every setting, of all three objects."""
        return [f.name for _, f in _all_fields()]

    @classmethod
    def resolve(cls, settings: Settings | dict[str, Any] | None = None, **overrides: Any) -> Settings:
        """Build settings from an object, a dict of setting names (e.g. a graph's context) or overrides."""
        if isinstance(settings, Settings):
            base = settings
        else:
            base = cls()
            if settings:
                overrides = {**{k: v for k, v in settings.items() if v is not None}, **overrides}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        return base.replace(**overrides) if overrides else base


GROUPS: dict[str, frozenset[str]] = {
    "tuning": frozenset(f.name for f in fields(Tuning)),
    "evaluation": frozenset(f.name for f in fields(EvalOptions)),
}
"""The settings each option object holds, by the :class:`Settings` attribute that carries it."""


def _own_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in fields(Settings) if not f.metadata.get("group")]


def _all_fields() -> list[tuple[str, dataclasses.Field[Any]]]:
    """Return ``(object, field)`` for every setting: the deployment's, then tuning's, then evaluation's."""
    return [("settings", f) for f in _own_fields()] + [
        (group, f) for group, kind in (("tuning", Tuning), ("evaluation", EvalOptions)) for f in fields(kind)
    ]


def _route(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Split setting values by the object that holds each (unknown names raise, naming the fix)."""
    own = {f.name for f in _own_fields()}
    unknown = set(values) - own - GROUPS["tuning"] - GROUPS["evaluation"]
    if unknown:
        raise ConfigurationError(f"unknown settings {sorted(unknown)}; see `dualmem --help` or the configuration page")
    split = [{k: v for k, v in values.items() if k in names} for names in (own, GROUPS["tuning"], GROUPS["evaluation"])]
    return split[0], split[1], split[2]


for _, _field in _all_fields():
    _field.metadata["holder"]["name"] = _field.name


def setting_default(name: str) -> Any:
    """Return the code default of setting ``name`` (not its environment override): for signatures and run configs
    that must agree with the settings instead of repeating its value.

    >>> setting_default("chunk_tokens")
    1024
    """
    for _, f in _all_fields():
        if f.name == name:
            return f.metadata["env_default"]
    raise KeyError(f"no setting {name!r}")


def setting_kind(name: str) -> type:
    """Return the type of setting ``name`` (that of its default): how ``--set`` and the environment parse it."""
    return type(setting_default(name))


def settings_table() -> list[tuple[str, str, str, str]]:
    """Return (field, env var, default, help) rows of every setting, of all three objects."""
    return [row[1:] for row in _rows()]


def settings_by_object() -> dict[str, list[tuple[str, str, str, str]]]:
    """Return :func:`settings_table`'s rows by the object holding them (``settings``, ``tuning``, ``evaluation``): the
    configuration page's tables."""
    out: dict[str, list[tuple[str, str, str, str]]] = {"settings": [], "tuning": [], "evaluation": []}
    for group, *row in _rows():
        out[group].append((row[0], row[1], row[2], row[3]))
    return out


def _rows() -> list[tuple[str, str, str, str, str]]:
    return [
        (
            group,
            f.name,
            ENV_ALIASES.get(f.name, ENV_PREFIX + f.name.upper()),
            repr(f.metadata["env_default"]),
            f.metadata["help"],
        )
        for group, f in _all_fields()
    ]


__all__ = [
    "DEFAULT_USER",
    "EvalOptions",
    "Settings",
    "Tuning",
    "setting_default",
    "settings_by_object",
    "settings_table",
]
