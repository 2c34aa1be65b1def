"""Who and where a chat run is: its memory namespace and thread, from the LangGraph runtime (one helper each).

The user comes from the run's context (``user_id`` key or attribute), else
``config["configurable"]["user_id"]``, else the LangGraph server's
authenticated user, else ``settings.user_id``; the thread from the run's
``thread_id``, else ``DEFAULT_THREAD``.
"""

from __future__ import annotations

from typing import Any

from dualmem.config import Settings
from dualmem.schema import Persona

DEFAULT_THREAD = "default"  # the thread of runs without a thread id (no checkpointer)


def lookup(holder: Any, key: str) -> Any:
    """Return ``key`` of a context (a dict or an object), None when absent."""
    if holder is None:
        return None
    if isinstance(holder, dict):
        return holder.get(key)
    return getattr(holder, key, None)


def run_configurable() -> dict[str, Any]:
    """Return the current run's ``configurable`` ({} outside a run)."""
    from langgraph.config import get_config

    try:
        return dict(get_config().get("configurable") or {})
    except RuntimeError:  # outside a graph run
        return {}


def chat_namespace(runtime: Any, persona: Persona, settings: Settings) -> tuple[str, str]:
    """Return the memory namespace of a run: (persona id, user from context, config, server user or settings)."""
    user = lookup(runtime.context, "user_id") or run_configurable().get("user_id")
    if not user and getattr(runtime, "server_info", None) is not None and runtime.server_info.user is not None:
        user = getattr(runtime.server_info.user, "identity", None)
    return (persona.id, str(user or settings.user_id))


def chat_thread(runtime: Any) -> str:
    """Return the run's thread id (``DEFAULT_THREAD`` for runs without one)."""
    info = getattr(runtime, "execution_info", None)
    return str((info.thread_id if info is not None else None) or run_configurable().get("thread_id") or DEFAULT_THREAD)
