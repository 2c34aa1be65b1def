"""The writer's exact prompt and chunking, seen from training.

Training must show the model exactly what the writer graph shows it, so this
module only adapts :mod:`dualmem.prompts.writer` (``render_writer_messages``,
``format_view``) and :func:`dualmem.memory.chunking.chunk_sessions` to plain
role/content dicts and tuples. Nothing here renders text of its own.
"""

from __future__ import annotations

from typing import Any

from dualmem.memory.chunking import chunk_sessions as writer_chunks
from dualmem.prompts.writer import format_view, render_writer_messages
from dualmem.schema import Persona, Session, Turn

ROLE = {"system": "system", "human": "user", "user": "user", "ai": "assistant", "assistant": "assistant"}


def to_dicts(messages: list[Any]) -> list[dict[str, str]]:
    """Return LangChain messages (or dicts) as ``[{"role", "content"}]`` with OpenAI role names."""
    out: list[dict[str, str]] = []
    for m in messages:
        if isinstance(m, dict):
            role = str(m["role"])
            out.append({"role": ROLE.get(role, role), "content": str(m["content"])})
        else:
            out.append({"role": ROLE.get(str(m.type), str(m.type)), "content": str(m.content)})
    return out


def render_messages(persona: Persona, view: str, chunk: str) -> list[dict[str, str]]:
    """Return the writer's prompt for one chunk as ``[{"role", "content"}, ...]``."""
    return to_dicts(render_writer_messages(persona, view, chunk))


def view_text(facts: list[tuple[str, str]], insights: list[tuple[str, str, list[str]]]) -> str:
    """Render a working view from ``(label, text)`` facts and ``(label, text, cited labels)`` insights."""
    return format_view(
        [{"label": label, "text": text} for label, text in facts],
        [{"label": label, "text": text, "cites": cites} for label, text, cites in insights],
    )


def chunk_sessions(sessions: list[Session], chunk_tokens: int, namespace: tuple[str, ...]) -> list[tuple[str, list[Turn], str]]:
    """Cut sessions exactly like the writer graph: ``(chunk id, turns, rendered text)``."""
    turns = {t.id: t for s in sessions for t in s.turns}
    return [(c["id"], [turns[t] for t in c["turn_ids"]], c["text"]) for c in writer_chunks(sessions, namespace, chunk_tokens)]
