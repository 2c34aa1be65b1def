"""Memory formation from chat: pending turns → sealed chunks → the write graph → settled.

A chat turn is *handed over* (:func:`dualmem.chat.pending.hand_over`): its
turns join the thread's pending turns in the store and a write of the thread
(a :class:`~dualmem.chat.pending.FormationRequest`) is scheduled — at once
when the pending turns reach ``chunk_tokens``, else once the thread has been
quiet for ``formation_idle_s`` (each new message postpones it). Where the write
runs is a :class:`Formation` (:func:`~dualmem.chat.runtime.formation_for` picks it): the background
executor of this process (:mod:`dualmem.chat.executor`) or scheduled runs of
the ``write`` graph on a LangGraph server (:mod:`dualmem.chat.server`). Both
run the same graph, in its pending mode (input ``pending: {"thread", "flush"}``),
which seals the thread's turns into chunks, writes them and settles them
(:func:`dualmem.chat.sealing.form_pending`; in this process that function runs directly).

A process killed anywhere in between loses nothing (the turns stay pending) and
writes nothing twice (a sealed chunk already applied is skipped by the ledger).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dualmem.chat.pending import Formation, FormationRequest
from dualmem.context import context_of
from dualmem.errors import ConfigurationError

__all__ = ["Formation", "FormationRequest", "Formed", "formation_input", "run_formation"]


@dataclass
class Formed:
    """What one formation run of a thread did, and what is still pending."""

    namespace: tuple[str, ...]
    thread: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # the writer's report rows, one per chunk
    pending_turns: int = 0
    pending_tokens: int = 0
    newest_at: float | None = None
    error: str | None = None


def formation_input(request: FormationRequest, *, flush: bool = False) -> dict[str, Any]:
    """Return the write graph's input that forms the thread's pending turns."""
    return {
        "persona": request.persona,
        "namespace": list(request.namespace),
        "pending": {"thread": request.thread, "flush": flush},
    }


def run_formation(request: FormationRequest, *, flush: bool = False) -> Formed:
    """Form the thread's pending turns in this process (``flush``: write them all now), as the write graph does."""
    from dualmem.chat.sealing import form_pending
    from dualmem.models import load_chat_model

    store = request.store
    if store is None:
        raise ConfigurationError(
            "chat memory needs the store: compile the agent or graph with store=LanceDBStore.from_settings()"
        )
    model = (
        None if request.writer_model is None else load_chat_model(request.writer_model, request.settings, role="writer")
    )
    context = context_of(request.settings, models={"writer": model} if model is not None else None, store=store)
    rows, left = form_pending(context, store, request.namespace, request.thread, flush=flush, persona=request.persona)
    return Formed(
        request.namespace, request.thread, rows, left["pending_turns"], left["pending_tokens"], left["newest_at"]
    )
