"""The one run context of every DualMem graph: a few per-run fields, any other setting by name, injected objects.

Every graph declares ``context_schema=Context``, so Studio and ``langgraph dev``
show these twelve fields. The first five are the settings a caller most often
changes per run; ``options`` takes any other setting by its name (``{"chunk_tokens":
512}``); the rest are objects the Python API injects (they cannot travel as JSON):

- ``models``: chat model objects by role (``"chat"``, ``"writer"``, ``"judge"``); who
  writes memory when none is named is decided by :meth:`Settings.writer_for`;
- ``embeddings``: an embeddings object used instead of the ``embedder`` setting;
- ``store``: the store a graph uses when it runs without ``runtime.store``;
- ``memory``: a memory framework object (respond and simulate graphs);
- ``formation``: where chat exchanges are formed into memory (a :mod:`dualmem.chat` Formation);
- ``run``: run resources of an evaluation (journal, judges, progress hooks).

:attr:`Context.settings` is the resolved :class:`~dualmem.config.Settings`:
the per-run fields over ``options`` over the environment over the defaults.
Nodes read it with :func:`context_of` and never open a store themselves.

>>> Context(chat_model="fake:memory").llm("writer").__class__.__name__
'FakeChatModel'
>>> Context(options={"chunk_tokens": 512}).settings.tuning.chunk_tokens
512
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dualmem.config import Settings
from dualmem.errors import ConfigurationError

ROLES = ("chat", "writer", "judge")
RUN_FIELDS = ("user_id", "chat_model", "writer_model", "framework", "retrieval_k")
OBJECTS = ("models", "embeddings", "store", "memory", "formation", "run")


@dataclass(frozen=True, kw_only=True)
class Context:
    """Per-run settings, any other setting by name, and injected objects (see the module docstring)."""

    user_id: str | None = field(
        default=None, metadata={"help": "whose memory: the second part of every memory namespace"}
    )
    chat_model: str | None = field(default=None, metadata={"help": "chat model as provider:model"})
    writer_model: str | None = field(
        default=None, metadata={"help": "model of the memory writer (empty: the chat model's writer)"}
    )
    framework: str | None = field(
        default=None, metadata={"help": "memory framework of the respond graph and evaluations"}
    )
    retrieval_k: int | None = field(default=None, metadata={"help": "facts and insights retrieved per query"})
    options: Settings | Mapping[str, Any] | None = field(default=None, metadata={"help": "any other setting by name"})
    models: Mapping[str, Any] | None = field(
        default=None, metadata={"help": "chat model objects by role: chat, writer, judge"}
    )
    embeddings: Any = field(default=None, metadata={"help": "embeddings object used instead of the embedder setting"})
    store: Any = field(default=None, metadata={"help": "the store used when the graph has no runtime.store"})
    memory: Any = field(
        default=None, metadata={"help": "memory framework object used instead of the framework setting's"}
    )
    formation: Any = field(default=None, metadata={"help": "where chat exchanges are formed into memory (a Formation)"})
    run: Any = field(default=None, metadata={"help": "run resources of an evaluation (journal, judges, hooks)"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "_built", {})  # models and settings built for this context, once (not a field)

    @property
    def settings(self) -> Settings:
        """Return the resolved settings: per-run fields over ``options`` over the environment."""
        built: dict[str, Any] = self._built  # type: ignore[attr-defined]
        if "settings" not in built:
            base = self.options if isinstance(self.options, Settings) else None
            overrides = dict(self.options) if isinstance(self.options, Mapping) else {}
            overrides.update({name: getattr(self, name) for name in RUN_FIELDS if getattr(self, name) is not None})
            built["settings"] = Settings.resolve(base, **overrides)
        return built["settings"]

    def llm(self, role: str = "chat") -> Any:
        """Return the chat model of ``role``: injected, else built from the settings (once per context)."""
        from dualmem.models import load_chat_model

        if role not in ROLES:
            raise ConfigurationError(f"model role {role!r} is not one of {ROLES}")
        given = dict(self.models or {})
        if role in given:
            return given[role]
        if role == "writer" and self.settings.writer_for(chat_given="chat" in given) is None:
            return given["chat"]  # the chat model handed over also writes
        if role == "judge" and not self.settings.evaluation.judge_model and "chat" in given:
            return given["chat"]
        built: dict[str, Any] = self._built  # type: ignore[attr-defined]
        if role not in built:
            built[role] = load_chat_model(None, self.settings, role=role)
        return built[role]

    def load_embedder(self) -> Any:
        """Return the injected embeddings, else the ``embedder`` setting's."""
        if self.embeddings is not None:
            return self.embeddings
        from dualmem.models import load_embeddings

        return load_embeddings(None, self.settings)

    def dual(self, runtime_store: Any = None) -> Any:
        """Return the run's ``DualStore``: ``runtime.store``'s, else the injected one; never opens one."""
        from dualmem.stores import dual_of

        target = runtime_store if runtime_store is not None else self.store
        if target is None:
            raise ConfigurationError(
                "no memory store: run the graph with a store (graph.compile(store=LanceDBStore.from_settings()), "
                "langgraph.json's store on the server) or pass store= to the Python API"
            )
        return dual_of(target)

    def with_(self, **changes: Any) -> Context:
        """Return a copy with fields, objects or any setting (by name, into ``options``) changed; unknown names raise."""
        own = {f.name for f in fields(self)}
        settings = {k: v for k, v in changes.items() if k not in own}
        if settings:
            self.settings.replace(**settings)  # names and values checked now
            base = self.options if isinstance(self.options, Settings) else None
            merged = {**(dict(self.options) if isinstance(self.options, Mapping) else {}), **settings}
            changes = {k: v for k, v in changes.items() if k in own}
            changes["options"] = base.replace(**settings) if base is not None else merged
        return dataclasses.replace(self, **changes)


def context_of(source: Any = None, **changes: Any) -> Context:
    """Return the Context of a graph runtime, a Context, Settings, a dict (context fields and settings by name) or None,
    with ``changes`` applied (None values are ignored)."""
    context = getattr(source, "context", source) if not isinstance(source, (Context, Settings, dict)) else source
    if isinstance(context, Context):
        ctx = context
    elif isinstance(context, Settings):
        ctx = Context(options=context)
    elif isinstance(context, Mapping):
        own = {f.name for f in fields(Context)}
        given = {k: v for k, v in context.items() if v is not None}
        known = set(Settings.field_names()) | own
        if unknown := set(given) - known:
            raise ConfigurationError(
                f"unknown context keys {sorted(unknown)}; a context takes its fields and the settings of the README table"
            )
        ctx = Context(**{k: v for k, v in given.items() if k in own})
        settings = {k: v for k, v in given.items() if k not in own}
        if settings:
            ctx = ctx.with_(**settings)
    elif context is None:
        ctx = Context()
    else:
        raise ConfigurationError(
            f"a graph context is a Context, Settings or a dict of settings, got {type(context).__name__}"
        )
    changes = {k: v for k, v in changes.items() if v is not None}
    return ctx.with_(**changes) if changes else ctx


__all__ = ["Context", "context_of"]
