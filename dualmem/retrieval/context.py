"""The conversation around a query: the recent turns a ranker reads as context.

Callers pass what they have: dataset turns (:class:`~dualmem.schema.Turn`),
LangChain messages, ``{"role", "content"}`` dicts (OpenAI style, or ``text``
and ``speaker``), or plain strings (a user's earlier messages). Each becomes a
:class:`ContextTurn`; its ``text`` is what the ranker embeds — ``"Speaker:
text"`` when a speaker is known, as ``raw-turns`` stores its turns.

>>> [t.text for t in context_turns(["hi", {"role": "assistant", "content": "hello"}])]
['hi', 'hello']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLES = {"human": "user", "ai": "assistant", "user": "user", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class ContextTurn:
    """One turn of the conversation before the query."""

    role: str
    content: str
    speaker: str | None = None

    @property
    def text(self) -> str:
        """Return the turn as the ranker embeds it (``"Speaker: text"`` when the speaker is known)."""
        return f"{self.speaker}: {self.content}" if self.speaker else self.content


def _one(turn: Any) -> ContextTurn | None:
    if isinstance(turn, ContextTurn):
        return turn
    if isinstance(turn, str):
        return ContextTurn("user", turn)
    if isinstance(turn, Mapping):
        content = turn.get("content", turn.get("text"))
        role = str(turn.get("role") or turn.get("type") or "user")
        speaker = turn.get("speaker") or turn.get("name")
    else:  # a dataset Turn or a LangChain message
        content = turn.content if hasattr(turn, "content") else getattr(turn, "text", None)
        role = str(getattr(turn, "role", None) or getattr(turn, "type", None) or "user")
        speaker = getattr(turn, "speaker", None) or getattr(turn, "name", None)
    if isinstance(content, list):  # content blocks
        content = " ".join(b.get("text", "") if isinstance(b, Mapping) else str(b) for b in content)
    if not isinstance(content, str) or not content.strip():
        return None
    return ContextTurn(ROLES.get(role.lower(), role.lower()), content.strip(), str(speaker) if speaker else None)


def context_turns(context: Sequence[Any] | None, last: int | None = None) -> list[ContextTurn]:
    """Return the non-empty turns of ``context`` (the ``last`` ones when given), oldest first; system turns dropped."""
    turns = [t for t in (_one(x) for x in context or []) if t is not None and t.role != "system"]
    return turns[-last:] if last else turns
