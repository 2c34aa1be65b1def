"""Who and where a chat run is: its memory namespace and thread, from the LangGraph runtime (one helper each), and
where its memory is formed (:func:`formation_for`).

The user is decided by :func:`dualmem.auth.whose_memory`: on a server with
authentication, the authenticated user (a different ``user_id`` in the run's
context or configurable is refused); else the run's context ``user_id`` (key or
attribute) or ``config["configurable"]["user_id"]``, else ``settings.user``;
the thread from the run's ``thread_id``, else ``DEFAULT_THREAD``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dualmem.auth import lookup, run_configurable, whose_memory
from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.schema import Persona

if TYPE_CHECKING:
    from dualmem.chat.pending import Formation

__all__ = ["DEFAULT_THREAD", "chat_namespace", "chat_thread", "formation_for", "lookup", "run_configurable"]
DEFAULT_THREAD = "default"  # the thread of runs without a thread id (no checkpointer)


def chat_namespace(runtime: Any, persona: Persona, settings: Settings) -> tuple[str, str]:
    """Return the memory namespace of a run: (persona id, whose memory by :func:`dualmem.auth.whose_memory`)."""
    return (persona.id, whose_memory(runtime, settings=settings))


def chat_thread(runtime: Any) -> str:
    """Return the run's thread id (``DEFAULT_THREAD`` for runs without one)."""
    info = getattr(runtime, "execution_info", None)
    return str((info.thread_id if info is not None else None) or run_configurable().get("thread_id") or DEFAULT_THREAD)


def formation_for(settings: Settings, runtime: Any = None) -> Formation:
    """Return the formation ``settings.formation`` asks for (auto: the LangGraph server the run is on, else this process)."""
    from dualmem.chat.executor import default_executor
    from dualmem.chat.server import server_formation

    on_server = getattr(runtime, "server_info", None) is not None
    if settings.formation == "server" or (settings.formation == "auto" and (on_server or settings.formation_url)):
        if not on_server and not settings.formation_url:
            raise ConfigurationError(
                "formation=server outside a LangGraph server needs the server's address: set formation_url "
                "(DUALMEM_FORMATION_URL), or use formation=local"
            )
        return server_formation(settings.formation_url or None)
    return default_executor()
