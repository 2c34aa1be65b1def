"""The generic in-character reader every framework's default ``respond`` uses.

One prompt (:mod:`dualmem.prompts.respond`) and one chat model for all
frameworks, so an evaluation compares memories, not prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.messages import BaseMessage

from dualmem.prompts.respond import format_memory_lines, render_respond_messages

if TYPE_CHECKING:
    from dualmem.frameworks.base import FrameworkContext, RetrievedItem


def items_text(items: Sequence[RetrievedItem]) -> str:
    """Render retrieved items as the memory block of the reply prompt."""
    return format_memory_lines([{"text": i.text, "kind": i.kind, "session": i.source_session} for i in items])


def reader_messages(context: FrameworkContext, query: str, items: Sequence[RetrievedItem], history: Sequence[object] | None = None) -> list[BaseMessage]:
    """Return the reply prompt for ``query`` with ``items`` as memory."""
    return render_respond_messages(context.persona, items_text(items), query, history)


def answer_from_memory(context: FrameworkContext, query: str, memory: str) -> str:
    """Answer ``query`` in character (``context.persona``) from a rendered memory block with the shared chat model."""
    from dualmem.nodes.respond import message_text
    from dualmem.retry import invoke_with_retry

    messages = render_respond_messages(context.persona, memory, query)
    return message_text(invoke_with_retry(context.chat(), messages, policy=context.settings))


def answer_from_items(context: FrameworkContext, query: str, items: Sequence[RetrievedItem]) -> str:
    """Answer ``query`` in character from retrieved items (rendered generically)."""
    return answer_from_memory(context, query, items_text(items))
