"""Registry of memory frameworks: every name selectable by ``--framework`` and settings.

Entries are imported lazily so that a framework's optional dependencies are
only needed when it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.preflight import require_extra

# name -> "module:Class"
REGISTRY: dict[str, str] = {
    "dualmem": "dualmem.frameworks.dualmem:DualMemFramework",
    "full-context": "dualmem.frameworks.full_context:FullContextFramework",
    "mem0-classic": "dualmem.frameworks.mem0_classic:Mem0ClassicFramework",
    "langmem": "dualmem.frameworks.langmem_fw:LangMemFramework",
    "memagent": "dualmem.frameworks.memagent:MemAgentFramework",
    "memorybank": "dualmem.frameworks.memorybank:MemoryBankFramework",
    "amem": "dualmem.frameworks.amem:AMemFramework",
    "emotional-rag": "dualmem.frameworks.emotional_rag:EmotionalRAGFramework",
    "bookmarks": "dualmem.frameworks.bookmarks:BookmarksFramework",
    "raw-turns": "dualmem.frameworks.raw_turns:RawTurnsFramework",
}
# frameworks whose packages come with an optional extra of pyproject.toml
EXTRA_OF: dict[str, str] = {"langmem": "frameworks"}


def available() -> list[str]:
    """Return the registered framework names."""
    return list(REGISTRY)


def framework_class(name: str) -> type[MemoryFramework]:
    """Return the class registered under ``name``; a framework whose extra is not installed raises
    :class:`ConfigurationError` naming the ``pip install`` that adds it."""
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown framework {name!r}; choose one of {', '.join(REGISTRY)} (see `dualmem frameworks`)"
        ) from None
    if name in EXTRA_OF:
        require_extra(EXTRA_OF[name], f"the {name} framework")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def open_framework(
    name: str | None = None, context: FrameworkContext | None = None, **context_kwargs: Any
) -> MemoryFramework:
    """Build the framework ``name`` (default: ``settings.evaluation.framework``) for one namespace."""
    if context is None:
        context_kwargs.setdefault("settings", Settings())
        context_kwargs.setdefault("namespace", ("persona", context_kwargs["settings"].user))
        context = FrameworkContext(**context_kwargs)
    return framework_class(name or context.settings.evaluation.framework)(context)


__all__ = [
    "REGISTRY",
    "FrameworkContext",
    "IngestReport",
    "MemoryFramework",
    "RetrievedItem",
    "available",
    "framework_class",
    "open_framework",
]
