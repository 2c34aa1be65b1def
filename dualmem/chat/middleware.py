"""DualMem as the memory of a LangChain agent: ``create_agent(..., middleware=[DualMemMiddleware(persona=...)], store=...)``.

- ``before_agent`` (once per turn, before the first model call): recalls the
  persona's facts and insights for the user's latest message, with the recent
  turns as context (:func:`~dualmem.chat.recall.recall_for_chat`), and renders
  them with their grounding into the respond graph's system prompt;
- ``wrap_model_call``: every model call of the turn gets that system prompt
  (the agent's own ``system_prompt`` follows it);
- ``after_agent``: hands the exchange (the user's messages and the final
  reply) to memory formation (:mod:`dualmem.chat.formation`) — stored as
  pending turns before the run ends, written in the background.

The namespace is ``(persona id, user)``, the user by :func:`dualmem.auth.whose_memory` (see
:mod:`dualmem.chat.runtime`); the persona is the middleware's, else the context's or configurable's ``persona``.
The store is the agent's (``runtime.store``, a :class:`~dualmem.stores.LanceDBStore`).
Sync and async agents share one core; the async hooks never block the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage

from dualmem.chat.formation import Formation
from dualmem.chat.pending import ahand_over, hand_over
from dualmem.chat.recall import recall_for_chat
from dualmem.chat.runtime import chat_namespace, chat_thread, formation_for, lookup, run_configurable
from dualmem.config import Settings
from dualmem.context import context_of
from dualmem.errors import ConfigurationError
from dualmem.prompts.respond import message_text, render_respond_system
from dualmem.schema import Persona


class DualMemState(AgentState[Any]):
    """The agent state plus the persona's system prompt with this turn's recalled memory (private)."""

    dualmem_prompt: NotRequired[Annotated[str, PrivateStateAttr]]


@dataclass
class ChatTurn:
    """Who is talking to whom in this run, and where their memory lives."""

    persona: Persona
    namespace: tuple[str, str]
    thread: str
    store: Any  # the agent's LangGraph store


def exchange(messages: Sequence[AnyMessage]) -> tuple[list[AnyMessage], list[str]]:
    """Return the turn's exchange (the user's messages since the previous reply, the final reply) and the user's earlier texts."""
    finals = [i for i, m in enumerate(messages) if isinstance(m, AIMessage) and not m.tool_calls and message_text(m)]
    if not finals:
        return [], []
    last, previous = finals[-1], (finals[-2] if len(finals) > 1 else -1)
    said = [m for m in messages[previous + 1 : last] if isinstance(m, HumanMessage)]
    earlier = [message_text(m) for m in messages[: previous + 1] if isinstance(m, HumanMessage)]
    return ([*said, messages[last]] if said else []), earlier


class DualMemMiddleware(AgentMiddleware[DualMemState, Any]):
    """Give a LangChain agent a persona's DualMem memory: recall before the model, form memory after the turn."""

    state_schema = DualMemState

    def __init__(
        self,
        persona: Persona | dict[str, Any] | None = None,
        *,
        settings: Settings | dict[str, Any] | None = None,
        writer_model: Any = None,
        formation: Formation | None = None,
        remember: bool = True,
    ) -> None:
        self.persona = None if persona is None else Persona.model_validate(persona)
        self.settings = Settings.resolve(settings)
        self.writer_model = writer_model  # the writer in this process (a model or spec); None = settings.writer
        self.formation = formation  # None = by settings.formation (the server's write runs, or this process's executor)
        self.remember = remember
        self.tools = []

    # ------------------------------------------------------------------ core

    def chat_turn(self, runtime: Any) -> ChatTurn:
        """Resolve the run's persona, namespace, thread and store."""
        found = self.persona or lookup(runtime.context, "persona") or run_configurable().get("persona")
        if found is None:
            raise ConfigurationError(
                "DualMemMiddleware needs a persona: DualMemMiddleware(persona=...), or `persona` in the run's context"
            )
        persona = Persona.model_validate(found)
        if runtime.store is None:
            raise ConfigurationError(
                "DualMemMiddleware needs the agent's store: create_agent(..., store=LanceDBStore.from_settings())"
            )
        return ChatTurn(persona, chat_namespace(runtime, persona, self.settings), chat_thread(runtime), runtime.store)

    def _recall(
        self, turn: ChatTurn, messages: Sequence[AnyMessage], current: str | None = None
    ) -> dict[str, Any] | None:
        if not messages or not isinstance(messages[-1], HumanMessage):  # a resumed turn: keep its memory, or show none
            return None if current else {"dualmem_prompt": render_respond_system(turn.persona, "")}
        window = messages[-self.settings.tuning.ranker_context_turns - 1 : -1]  # what the ranker reads as context
        recent = [m for m in window if isinstance(m, HumanMessage | AIMessage) and message_text(m)]
        db = context_of(self.settings).dual(turn.store)
        text = recall_for_chat(db, turn.namespace, message_text(messages[-1]), recent, self.settings, turn.persona)
        return {"dualmem_prompt": render_respond_system(turn.persona, text)}

    def _hand_over_args(self, state: DualMemState, runtime: Any) -> tuple[Any, ...] | None:
        """Return :func:`~dualmem.chat.pending.hand_over`'s arguments for the turn's exchange (None: nothing to hand
        over): its messages ``(role, text, message id)`` and the user's messages before them."""
        said, earlier = exchange(state["messages"])
        if not self.remember or not said:
            return None
        turn = self.chat_turn(runtime)
        messages = [("user" if isinstance(m, HumanMessage) else "assistant", message_text(m), m.id) for m in said]
        formation = self.formation or formation_for(self.settings, runtime)
        return (
            turn.persona,
            turn.namespace,
            turn.thread,
            self.settings,
            turn.store,
            messages,
            formation,
            earlier,
            self.writer_model,
        )

    @staticmethod
    def _with_memory(request: ModelRequest[Any]) -> ModelRequest[Any]:
        prompt = str(request.state.get("dualmem_prompt") or "")
        if not prompt:
            return request
        own = request.system_message.text if request.system_message is not None else ""
        return request.override(system_message=SystemMessage(content=f"{prompt}\n\n{own}" if own else prompt))

    # ------------------------------------------------------------------ hooks

    def before_agent(self, state: DualMemState, runtime: Any) -> dict[str, Any] | None:
        """Recall memory for the user's latest message into this turn's system prompt."""
        return self._recall(self.chat_turn(runtime), state["messages"], state.get("dualmem_prompt"))

    async def abefore_agent(self, state: DualMemState, runtime: Any) -> dict[str, Any] | None:
        """Async :meth:`before_agent` (retrieval runs in a worker thread)."""
        return await asyncio.to_thread(
            self._recall, self.chat_turn(runtime), state["messages"], state.get("dualmem_prompt")
        )

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        """Call the model with the persona's system prompt and recalled memory."""
        return handler(self._with_memory(request))

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> ModelResponse[Any]:
        """Async :meth:`wrap_model_call`."""
        return await handler(self._with_memory(request))

    def after_agent(self, state: DualMemState, runtime: Any) -> dict[str, Any] | None:
        """Hand the exchange to memory formation (stored as pending turns now, written in the background)."""
        if args := self._hand_over_args(state, runtime):
            hand_over(*args)
        return None

    async def aafter_agent(self, state: DualMemState, runtime: Any) -> dict[str, Any] | None:
        """Async :meth:`after_agent`."""
        if args := self._hand_over_args(state, runtime):
            await ahand_over(*args)
        return None
