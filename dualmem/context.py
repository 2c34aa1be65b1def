"""The one context of every DualMem graph: the settings, plus objects injected by the Python API and tests.

Every graph declares ``context_schema=Context``. ``Context`` *is* a
:class:`~dualmem.config.Settings` (every setting is a field, so ``langgraph
dev`` and Studio pass a flat dict such as ``{"chat_model": "fake:memory",
"user_id": "carol"}``, which LangGraph turns into a ``Context``) with a few
optional objects that cannot travel as JSON:

- ``models``: chat model objects by role (``"chat"``, ``"writer"``, ``"judge"``); a
  role missing here is built from its setting (``writer_model`` / ``judge_model``
  fall back to the chat model, object or spec);
- ``embeddings``: an embeddings object used instead of the ``embedder`` setting;
- ``store``: a ``DualStore`` or ``LanceDBStore`` used when the graph runs without
  ``runtime.store`` (graphs prefer the store they were compiled with);
- ``memory``: a memory framework object used instead of the ``framework`` setting's
  (respond and simulate graphs);
- ``run``: run resources of an evaluation (journal, judges, progress hooks).

Nodes read it with :func:`context_of` and never open a store themselves.

>>> Context(chat_model="fake:memory").llm("writer").__class__.__name__
'FakeChatModel'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dualmem.config import Settings
from dualmem.errors import ConfigurationError

ROLES = ("chat", "writer", "judge")


@dataclass(frozen=True, kw_only=True)
class Context(Settings):
    """Every setting plus optional injected objects (see the module docstring)."""

    models: Mapping[str, Any] | None = field(default=None, metadata={"help": "chat model objects by role: chat, writer, judge"})
    embeddings: Any = field(default=None, metadata={"help": "embeddings object used instead of the embedder setting"})
    store: Any = field(default=None, metadata={"help": "DualStore / LanceDBStore used when the graph has no runtime.store"})
    memory: Any = field(default=None, metadata={"help": "memory framework object used instead of the framework setting's"})
    run: Any = field(default=None, metadata={"help": "run resources of an evaluation (journal, judges, hooks)"})
    memory_formation: Any = field(default=None, metadata={"help": "where chat exchanges are formed into memory (a dualmem.chat Formation object); None = by the formation setting"})
    _built: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, metadata={"help": "built objects"})

    @property
    def settings(self) -> Settings:
        """Return the plain settings of this context."""
        return Settings(**{f.name: getattr(self, f.name) for f in fields(Settings)})

    def llm(self, role: str = "chat") -> Any:
        """Return the chat model of ``role``: injected, else built from the settings (once per context)."""
        from dualmem.models import load_chat_model

        if role not in ROLES:
            raise ConfigurationError(f"model role {role!r} is not one of {ROLES}")
        given = dict(self.models or {})
        if role in given:
            return given[role]
        named = {"writer": self.writer_model, "judge": self.judge_model}.get(role, "")
        if role != "chat" and not named and "chat" in given:
            return given["chat"]  # an injected chat model also writes and judges unless another is named
        if role not in self._built:
            self._built[role] = load_chat_model(None, self.settings, role=role)
        return self._built[role]

    def load_embedder(self) -> Any:
        """Return the injected embeddings, else the ``embedder`` setting's (built once per context)."""
        if self.embeddings is not None:
            return self.embeddings
        if "embeddings" not in self._built:
            from dualmem.models import load_embeddings

            self._built["embeddings"] = load_embeddings(None, self.settings)
        return self._built["embeddings"]

    def dual(self, runtime_store: Any = None) -> Any:
        """Return the ``DualStore`` of the run: ``runtime.store``'s, else the injected one; never opens one."""
        from dualmem.stores import dual_of

        target = runtime_store if runtime_store is not None else self.store
        if target is None:
            raise ConfigurationError(
                "no memory store: run the graph with a store (graph.compile(store=LanceDBStore.from_settings()), "
                "langgraph.json's store on the server) or pass store= to the Python API"
            )
        return dual_of(target)

    def with_(self, **changes: Any) -> Context:
        """Return a copy with settings or objects changed (unknown names raise)."""
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ConfigurationError(f"unknown settings {sorted(unknown)}; see `dualmem --help` or the README table")
        return dataclasses.replace(self, **changes, _built={})


def context_of(source: Any = None, **changes: Any) -> Context:
    """Return the Context of a graph runtime, a Context, Settings, a dict of settings or None (plus ``changes``)."""
    context = getattr(source, "context", source) if not isinstance(source, (Context, Settings, dict)) else source
    if isinstance(context, Context):
        ctx = context
    elif isinstance(context, Settings):
        ctx = Context(**{f.name: getattr(context, f.name) for f in fields(Settings)})
    elif isinstance(context, Mapping):
        known = {f.name for f in fields(Context)}
        unknown = set(context) - known
        if unknown:
            raise ConfigurationError(f"unknown context keys {sorted(unknown)}; a context takes the settings of the README table")
        ctx = Context(**{k: v for k, v in context.items() if v is not None})
    elif context is None:
        ctx = Context()
    else:
        raise ConfigurationError(f"a graph context is a Context, Settings or a dict of settings, got {type(context).__name__}")
    changes = {k: v for k, v in changes.items() if v is not None}
    return ctx.with_(**changes) if changes else ctx


def runtime_store(runtime: Any) -> Any:
    """Return ``runtime.store`` (None outside a graph or without a store)."""
    return getattr(runtime, "store", None)
