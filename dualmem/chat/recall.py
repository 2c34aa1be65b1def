"""What a chat turn remembers: the one retrieval call of the chat path, and its prompt block.

:func:`recall_for_chat` is the single place where chat (the middleware) asks
for memory. It takes the user's latest message and the recent turns as
context; today it runs the respond core's retrieval
(:func:`dualmem.nodes.respond.recall_memory`: dual-stream hybrid search,
insights expanded with the facts they cite), which reads the message alone —
the ranked retrieval pipeline replaces it here and uses the context.
"""

from __future__ import annotations

from collections.abc import Sequence

from dualmem.config import Settings
from dualmem.nodes.respond import memory_text, recall_memory
from dualmem.nodes.writer import WriterResources
from dualmem.prompts.respond import render_respond_system
from dualmem.schema import Persona
from dualmem.stores.dual import DualResult, DualStore

RECENT_TURNS = 6  # recent messages handed to retrieval as context


def recall_for_chat(store: DualStore, namespace: tuple[str, ...], query: str, recent: Sequence[str], settings: Settings) -> DualResult:
    """Return the facts and insights (with grounding) of ``namespace`` for the user's latest message."""
    res = WriterResources(settings, store=store, role="chat")
    return recall_memory(res, namespace, query, k=settings.retrieval_k, mode=settings.retrieval_mode)


def memory_prompt(persona: Persona, result: DualResult) -> str:
    """Return the persona's system prompt with the recalled memory, in the respond graph's format."""
    return render_respond_system(persona, memory_text(result))
