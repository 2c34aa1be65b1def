"""Who and where a chat run is: its memory namespace and thread, from the LangGraph runtime (one helper each).

The user is decided by :func:`dualmem.auth.whose_memory`: on a server with
authentication, the authenticated user (a different ``user_id`` in the run's
context or configurable is refused); else the run's context ``user_id`` (key or
attribute) or ``config["configurable"]["user_id"]``, else ``settings.user``;
the thread from the run's ``thread_id``, else ``DEFAULT_THREAD``.
"""

from __future__ import annotations

from typing import Any

from dualmem.auth import lookup, run_configurable
from dualmem.config import Settings
from dualmem.schema import Persona

__all__ = ["DEFAULT_THREAD", "chat_namespace", "chat_thread", "lookup", "run_configurable"]
DEFAULT_THREAD = "default"  # the thread of runs without a thread id (no checkpointer)


def chat_namespace(runtime: Any, persona: Persona, settings: Settings) -> tuple[str, str]:
    """Return the memory namespace of a run: (persona id, whose memory by :func:`dualmem.auth.whose_memory`)."""
    from dualmem.auth import whose_memory

    return (persona.id, whose_memory(runtime, settings=settings))


def chat_thread(runtime: Any) -> str:
    """Return the run's thread id (``DEFAULT_THREAD`` for runs without one)."""
    info = getattr(runtime, "execution_info", None)
    return str((info.thread_id if info is not None else None) or run_configurable().get("thread_id") or DEFAULT_THREAD)
