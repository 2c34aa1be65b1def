"""The respond graph's exchange handed to memory formation, and where formation runs (:func:`formation_for`).

The respond graph's ``remember`` hands its exchange over here when the memory
framework forms memory in the background (DualMem), through the one hand-over
the chat middleware uses too (:func:`dualmem.chat.pending.hand_over`); the
memory-poisoning guard reads the user's earlier messages, as when the
exchange is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dualmem.chat.formation import Formation
from dualmem.chat.pending import HandedOver, ahand_over, hand_over
from dualmem.chat.runtime import chat_thread
from dualmem.config import Settings
from dualmem.context import Context
from dualmem.errors import ConfigurationError
from dualmem.schema import Persona


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


def injected_writer(ctx: Context) -> Any:
    """Return the writer model object the context carries (None: the ``writer`` setting's, built where the write runs)."""
    given = dict(ctx.models or {})
    if "writer" in given:
        return given["writer"]
    return given.get("chat") if not ctx.settings.writer_model else None


@dataclass(frozen=True)
class Exchange:
    """One exchange of the respond graph, as memory formation needs it.

    ``earlier``: the user's messages before this one (the memory-poisoning guard's context); ``message_ids``: the ids
    of the user's and the reply's messages (turn ids derive from them, so a resumed run hands nothing over twice).
    """

    persona: Persona
    namespace: tuple[str, ...]
    query: str
    reply: str
    earlier: Sequence[str] = ()
    message_ids: tuple[str | None, str | None] = (None, None)


def remember_exchange(ctx: Context, runtime: Any, exchange: Exchange) -> dict[str, Any]:
    """Hand the respond graph's exchange to memory formation; return what the graph reports of it: the thread, its
    pending turns and tokens, and the memory-poisoning guard's flags on the user's message."""
    return _pending(hand_over(*_hand_over_args(ctx, runtime, exchange)))


async def aremember_exchange(ctx: Context, runtime: Any, exchange: Exchange) -> dict[str, Any]:
    """Async :func:`remember_exchange` (on the LangGraph server the write run is scheduled in process)."""
    return _pending(await ahand_over(*await asyncio.to_thread(_hand_over_args, ctx, runtime, exchange)))


def _hand_over_args(ctx: Context, runtime: Any, exchange: Exchange) -> tuple[Any, ...]:
    store = getattr(runtime, "store", None)
    user_id, reply_id = exchange.message_ids
    return (
        exchange.persona,
        exchange.namespace,
        chat_thread(runtime),
        ctx.settings,
        store if store is not None else ctx.dual(None),
        [("user", exchange.query, user_id), ("assistant", exchange.reply, reply_id)],
        ctx.formation or formation_for(ctx.settings, runtime),
        exchange.earlier,
        injected_writer(ctx),
    )


def _pending(done: HandedOver) -> dict[str, Any]:
    return {
        "thread": done.request.thread,
        "turns": len(done.pending.turns),
        "tokens": done.unsealed_tokens,
        "flagged": [dict(f) for f in done.flags],
    }
