"""The in-character reply prompt, shared by DualMem and every baseline's reader.

One template for all frameworks keeps comparisons fair: only the memory block
differs (DualMem shows facts and the persona's insights with the facts they
rest on; a baseline shows whatever its ``retrieve`` returned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from dualmem.schema import MemoryItem, Persona

RESPOND_SYSTEM = """You are {name}. Stay fully in character in everything you say.

## Who you are
{persona}

## What you remember about the user
{memory}

## How to answer
Reply to the user's latest message as {name} would: in your own voice, with your \
values and way of seeing people. Use what you remember when it is relevant: refer \
to concrete things the user told you and to your own earlier reading of them, and \
connect them to the question. Never invent events the user did not tell you, and \
never mention memories, notes, databases or retrieval. Keep the reply short \
(at most {max_words} words)."""

NO_PERSONA = "(no persona given: answer as a warm, thoughtful companion)"
NO_MEMORY = "(nothing relevant remembered)"
MAX_WORDS = 150
HISTORY_MESSAGES = 12


def message_text(message: Any) -> str:
    """Return the text of a model answer (string content or content blocks)."""
    content = getattr(message, "content", message)
    if isinstance(content, list):
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content).strip()
    return str(content).strip()


def format_memory_lines(items: Sequence[Mapping[str, Any]]) -> str:
    """Render generic retrieved items (``text``, ``kind``, optional ``session``) as a list."""
    if not items:
        return NO_MEMORY
    lines = []
    for item in items:
        where = f", session {item['session']}" if item.get("session") else ""
        lines.append(f"- ({item.get('kind') or 'memory'}{where}) {' '.join(str(item['text']).split())}")
    return "\n".join(lines)


def format_dual_memory(
    facts: Sequence[MemoryItem],
    insights: Sequence[MemoryItem],
    grounding: Mapping[str, Sequence[MemoryItem]] | None = None,
) -> str:
    """Render facts and insights; each insight is followed by the facts it rests on."""
    if not facts and not insights:
        return NO_MEMORY
    grounding = grounding or {}
    lines: list[str] = []
    if facts:
        lines.append("Things the user told you:")
        lines.extend(f"- {_dated(f)}{_request_note(f)}{f.text}" for f in facts)
    if insights:
        lines.append("What you made of them (your own insights):")
        for ins in insights:
            lines.append(f"- {ins.text}")
            lines.extend(f"    because: {f.text}" for f in grounding.get(ins.id, []))
    return "\n".join(lines)


def _request_note(item: MemoryItem) -> str:
    """Mark a request fact (the guard's ``meta.guard``): what the user asked, never the persona's view."""
    return "(a request you did not adopt; not your belief) " if item.meta.get("guard") else ""


def _dated(item: MemoryItem) -> str:
    return f"({item.event_time}) " if item.event_time else ""


def history_messages(history: Sequence[Any] | None, limit: int = HISTORY_MESSAGES) -> list[BaseMessage]:
    """Return recent chat turns as messages from ``(user, reply)`` pairs or messages."""
    out: list[BaseMessage] = []
    for entry in history or []:
        if isinstance(entry, BaseMessage):
            out.append(entry)
        else:
            user, reply = entry
            out.extend([HumanMessage(content=str(user)), AIMessage(content=str(reply))])
    return out[-limit:] if limit else []


def render_respond_system(persona: Persona | None, memory_text: str, *, max_words: int = MAX_WORDS) -> str:
    """Return the reply prompt's system text: who the persona is, what it remembers, how to answer."""
    name = persona.name if persona else "the user's companion"
    return RESPOND_SYSTEM.format(
        name=name,
        persona=persona.render() if persona else NO_PERSONA,
        memory=memory_text or NO_MEMORY,
        max_words=max_words,
    )


def render_respond_messages(
    persona: Persona | None,
    memory_text: str,
    query: str,
    history: Sequence[Any] | None = None,
    *,
    max_words: int = MAX_WORDS,
) -> list[BaseMessage]:
    """Return the reply prompt: system (persona + memory), recent turns, the user's message."""
    system = render_respond_system(persona, memory_text, max_words=max_words)
    return [SystemMessage(content=system), *history_messages(history), HumanMessage(content=query)]
