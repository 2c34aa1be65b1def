"""A reply's exchange handed to memory formation (pending turns of the run's thread), and where formation runs (:func:`formation_for`).

The respond graph's ``remember`` and the chat middleware hand exchanges over
here when the memory framework forms memory in the background (DualMem); the
memory-poisoning guard reads the user's earlier messages, as when the
exchange is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dualmem.chat.formation import Formation, FormationRequest
from dualmem.chat.runtime import chat_thread
from dualmem.config import Settings
from dualmem.context import Context
from dualmem.errors import ConfigurationError
from dualmem.memory.guard import TurnFlag, flag_turns
from dualmem.schema import Persona, Turn
from dualmem.writer.pending import EARLIER_MESSAGES, PendingTurn, Snapshot, new_turn, turn_id
from dualmem.writer.sealing import graph_store


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


def exchange_handover(
    ctx: Context,
    runtime: Any,
    namespace: tuple[str, ...],
    persona: Persona,
    exchange: tuple[str, str],
    earlier: Sequence[str] = (),
    message_ids: tuple[str | None, str | None] = (None, None),
) -> tuple[FormationRequest, list[PendingTurn], list[TurnFlag]]:
    """Return the exchange (query, reply) as pending turns of the run's thread, the formation request and the guard's flags.

    ``message_ids``: the ids of the user's and the reply's messages (stable turn ids: a resumed run hands nothing over twice).
    """
    thread = chat_thread(runtime)
    query, reply_text = exchange
    earlier = list(earlier)[-EARLIER_MESSAGES:]
    user = new_turn(turn_id(thread, message_ids[0], "user", query), "user", query, earlier=earlier)
    reply = new_turn(
        turn_id(thread, message_ids[1], "assistant", reply_text), "assistant", reply_text, speaker=persona.name, seq=1
    )
    store = graph_store(getattr(runtime, "store", None) or ctx.dual(getattr(runtime, "store", None)))
    request = FormationRequest(
        persona.model_dump(mode="json"),
        tuple(namespace),
        thread,
        ctx.settings,
        store=store,
        writer_model=injected_writer(ctx),
    )
    context = [Turn(id=f"earlier-{i}", role="user", text=text) for i, text in enumerate(earlier)]
    flags = list(flag_turns([Turn(id=user["id"], role="user", text=user["text"])], context=context).values())
    return request, [user, reply], flags


def pending_state(request: FormationRequest, snap: Snapshot, flags: list[TurnFlag]) -> dict[str, Any]:
    """Return what the respond graph reports of a hand-over: the thread's pending turns and the guard's flags."""
    return {
        "thread": request.thread,
        "turns": len(snap.turns),
        "tokens": snap.unsealed_tokens,
        "flagged": [dict(f) for f in flags],
    }
