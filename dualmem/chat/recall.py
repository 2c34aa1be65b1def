"""What a chat turn remembers: the one retrieval call of the chat middleware.

:func:`recall_for_chat` asks the DualMem framework's ``retrieve`` on the agent's store, with the recent turns as
context, and renders its ``memory_text`` (insights followed by the facts they cite), as in the respond graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dualmem.config import Settings
from dualmem.frameworks.base import FrameworkContext
from dualmem.frameworks.dualmem import DualMemFramework
from dualmem.schema import Persona
from dualmem.stores.contract import DualStore


def recall_for_chat(
    store: DualStore,
    namespace: tuple[str, ...],
    query: str,
    recent: Sequence[Any],
    settings: Settings,
    persona: Persona | None = None,
) -> str:
    """Return the memory block (facts and insights with their grounding) of ``namespace`` for the user's latest message.

    ``recent``: the turns before it (LangChain messages, role/content dicts or strings), read by the ranker as context.
    """
    fctx = FrameworkContext(
        namespace=(namespace[0], namespace[1]),
        settings=settings,
        persona=persona,
        embeddings=store.embeddings,
        store_uri=store.uri,
        store=store,
    )
    memory = DualMemFramework(fctx)
    return memory.memory_text(memory.retrieve(query, settings.tuning.retrieval_k, context=list(recent)))
