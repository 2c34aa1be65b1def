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
from dualmem.writer.pending import PendingTurn, Snapshot, new_turn, turn_id
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
        speaker = persona.name if role == "assistant" else ""
        turns.append(new_turn(turn_id(thread, message_id, role, text), role, text, speaker=speaker, earlier=earlier,
                              seq=seq))  # fmt: skip
        if role == "user":
            earlier = [*earlier, text]
    request = FormationRequest(persona.model_dump(mode="json"), tuple(namespace), thread, settings, store=store,
                               writer_model=writer_model)  # fmt: skip
    return request, turns


def exchange_handover(
    ctx: Context,
    runtime: Any,
    namespace: tuple[str, ...],
    persona: Persona,
    exchange: tuple[str, str],
    earlier: Sequence[str] = (),
    message_ids: tuple[str | None, str | None] = (None, None),
) -> tuple[FormationRequest, list[PendingTurn], list[TurnFlag]]:
    """Return the respond graph's exchange (query, reply) handed over (:func:`handover`) and the guard's flags.

    ``message_ids``: the ids of the user's and the reply's messages.
    """
    query, reply_text = exchange
    store = graph_store(getattr(runtime, "store", None) or ctx.dual(getattr(runtime, "store", None)))
    said = [("user", query, message_ids[0]), ("assistant", reply_text, message_ids[1])]
    request, turns = handover(persona, namespace, chat_thread(runtime), ctx.settings, store, said, earlier,
                              injected_writer(ctx))  # fmt: skip
    context = [Turn(id=f"earlier-{i}", role="user", text=text) for i, text in enumerate(turns[0]["earlier"])]
    flags = list(flag_turns([Turn(id=turns[0]["id"], role="user", text=query)], context=context).values())
    return request, turns, flags


def pending_state(request: FormationRequest, snap: Snapshot, flags: list[TurnFlag]) -> dict[str, Any]:
    """Return what the respond graph reports of a hand-over: the thread's pending turns and the guard's flags."""
    return {
        "thread": request.thread,
        "turns": len(snap.turns),
        "tokens": snap.unsealed_tokens,
        "flagged": [dict(f) for f in flags],
    }
