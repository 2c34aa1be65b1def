"""Memory while chatting: DualMem as the memory of a LangChain / LangGraph chat agent.

- :class:`~dualmem.chat.middleware.DualMemMiddleware` — ``create_agent`` middleware: recall before the model,
  hand each exchange to memory formation after the turn;
- :mod:`~dualmem.chat.pending` — chat turns waiting in the store for the writer;
- :mod:`~dualmem.chat.sealing` — the write graph's pending mode: turns sealed into chunks, then settled;
- :mod:`~dualmem.chat.formation` — pending turns → sealed chunks → the write graph (exactly once);
- :class:`~dualmem.chat.executor.FormationExecutor` — background, debounced formation in this process;
- :class:`~dualmem.chat.server.ServerFormation` — scheduled ``write`` runs on a LangGraph server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static tools (type checkers, the API check, the docs) see; imported lazily below
    from dualmem.chat.executor import FormationExecutor, default_executor
    from dualmem.chat.middleware import DualMemMiddleware
    from dualmem.chat.server import ServerFormation

__all__ = ["DualMemMiddleware", "FormationExecutor", "ServerFormation", "default_executor"]
_HOMES = {
    "DualMemMiddleware": "middleware",
    "FormationExecutor": "executor",
    "ServerFormation": "server",
    "default_executor": "executor",
}


def __getattr__(name: str) -> Any:  # lazy: the write graph imports formation without LangChain's agents
    if name not in _HOMES:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"dualmem.chat.{_HOMES[name]}"), name)
