"""A reply's exchange handed to memory formation (pending turns of the run's thread), and where formation runs (:func:`formation_for`).

The respond graph's ``remember`` and the chat middleware hand exchanges over
here when the memory framework forms memory in the background (DualMem); the
memory-poisoning guard reads the user's earlier messages, as when the
exchange is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dualmem.chat.formation import Formation, FormationRequest, ahand_over, hand_over
from dualmem.chat.pending import PendingTurn, Snapshot, new_turn
from dualmem.chat.runtime import chat_thread
from dualmem.chat.sealing import graph_store
from dualmem.config import Settings
from dualmem.context import Context
from dualmem.errors import ConfigurationError
from dualmem.memory.guard import TurnFlag, flag_turns
from dualmem.schema import Persona, Turn, stable_id


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


def handover(
    persona: Persona,
    namespace: tuple[str, ...],
    thread: str,
    settings: Settings,
    store: Any,
    said: Sequence[tuple[str, str, str | None]],
    earlier: Sequence[str] = (),
    writer_model: Any = None,
) -> tuple[FormationRequest, list[PendingTurn]]:
    """The one hand-over builder (respond graph and chat middleware): an exchange's messages ``(role, text, message
    id)`` as pending turns of ``thread``, and the formation request that writes them.

    Turn ids come from the message ids (a resumed run hands nothing over twice); each user turn keeps the user's
    messages before it (``earlier``, read by the memory-poisoning guard when the turns are written).
    """
    turns, earlier = [], list(earlier)
    for seq, (role, text, message_id) in enumerate(said):
        tid = stable_id(thread, message_id or "", role, "" if message_id else text, prefix="t-")
        speaker = persona.name if role == "assistant" else ""
        turns.append(new_turn(tid, role, text, speaker=speaker, earlier=earlier, seq=seq))
        if role == "user":
            earlier = [*earlier, text]
    request = FormationRequest(
        persona.model_dump(mode="json"), tuple(namespace), thread, settings, store=store, writer_model=writer_model
    )
    return request, turns


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
    request, turns, flags, formation = _exchange_request(ctx, runtime, exchange)
    return _pending(request, hand_over(request, turns, formation), flags)


async def aremember_exchange(ctx: Context, runtime: Any, exchange: Exchange) -> dict[str, Any]:
    """Async :func:`remember_exchange` (on the LangGraph server the write run is scheduled in process)."""
    request, turns, flags, formation = await asyncio.to_thread(_exchange_request, ctx, runtime, exchange)
    return _pending(request, await ahand_over(request, turns, formation), flags)


def _exchange_request(
    ctx: Context, runtime: Any, exchange: Exchange
) -> tuple[FormationRequest, list[PendingTurn], list[TurnFlag], Formation]:
    store = graph_store(getattr(runtime, "store", None) or ctx.dual(getattr(runtime, "store", None)))
    user_id, reply_id = exchange.message_ids
    said = [("user", exchange.query, user_id), ("assistant", exchange.reply, reply_id)]
    request, turns = handover(
        exchange.persona,
        exchange.namespace,
        chat_thread(runtime),
        ctx.settings,
        store,
        said,
        exchange.earlier,
        injected_writer(ctx),
    )
    context = [Turn(id=f"earlier-{i}", role="user", text=text) for i, text in enumerate(turns[0]["earlier"])]
    flags = list(flag_turns([Turn(id=turns[0]["id"], role="user", text=exchange.query)], context=context).values())
    return request, turns, flags, ctx.formation or formation_for(ctx.settings, runtime)


def _pending(request: FormationRequest, snap: Snapshot, flags: list[TurnFlag]) -> dict[str, Any]:
    return {
        "thread": request.thread,
        "turns": len(snap.turns),
        "tokens": snap.unsealed_tokens,
        "flagged": [dict(f) for f in flags],
    }
