"""Cut a history into token-bounded chunks at turn boundaries, with stable ids.

A chunk never crosses a session (it carries that session's id and date) and
never splits a turn: a single turn longer than the budget is a chunk of its own.
The memory-poisoning guard reads each whole session here: a chunk carries the
flags of its turns (requests to change the persona's memory, marked in its
text too) and the users' claims about what the persona believes.
The chunk id hashes the namespace, the session id and the turn ids, so the same
history always yields the same ids (the writer's ledger relies on it).

>>> from dualmem.schema import Session, Turn
>>> s = Session(id="s1", turns=[Turn(id="t1", role="user", text="hi")])
>>> [c["turn_ids"] for c in chunk_sessions([s], ("p", "u"), 100)]
[['t1']]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NotRequired

from typing_extensions import TypedDict

from dualmem.memory.guard import Claim, TurnFlag, flag_turns, turn_claims
from dualmem.models.tokens import count_tokens_batch
from dualmem.prompts.writer import format_chunk, format_turn, speaker_label
from dualmem.schema import Dialogue, Session, Turn, stable_id

QUOTE_CHARS = 600  # characters of a source turn kept with the facts it sources (the memory browser shows them)


class Chunk(TypedDict):
    """One writer step: whole turns of one session, rendered for the prompt."""

    id: str
    index: int
    session_id: str
    time: str | None
    turn_ids: list[str]
    user_turn_ids: list[str]
    text: str
    tokens: int
    flagged: NotRequired[list[TurnFlag]]  # the guard's requests among its turns (absent in old checkpoints)
    claims: NotRequired[list[Claim]]
    said: NotRequired[
        dict[str, str]
    ]  # turn id -> "Speaker: text" (at most QUOTE_CHARS), kept with the facts it sources


def chunk_id(namespace: Sequence[str], session_id: str, turn_ids: Sequence[str]) -> str:
    """Return the stable id of a chunk (namespace + session + turn ids)."""
    return stable_id(*namespace, session_id, *turn_ids, prefix="c")


def as_sessions(history: Dialogue | Session | Iterable[Session | dict[str, Any]]) -> list[Session]:
    """Return the sessions of a dialogue, a single session or an iterable of sessions (or their dicts)."""
    if isinstance(history, Dialogue):
        return list(history.sessions)
    if isinstance(history, Session):
        return [history]
    return [s if isinstance(s, Session) else Session.model_validate(s) for s in history]


def split_turns(
    turns: Sequence[Turn], max_tokens: int, flags: dict[str, str] | None = None
) -> list[tuple[list[Turn], list[int]]]:
    """Group turns into runs of at most ``max_tokens`` tokens (an over-long turn stands alone)."""
    sizes = count_tokens_batch([format_turn(t, (flags or {}).get(t.id)) for t in turns]) if turns else []
    groups: list[tuple[list[Turn], list[int]]] = []
    current: list[Turn] = []
    current_sizes: list[int] = []
    for turn, size in zip(turns, sizes, strict=True):
        if current and sum(current_sizes) + size > max_tokens:
            groups.append((current, current_sizes))
            current, current_sizes = [], []
        current.append(turn)
        current_sizes.append(size)
    if current:
        groups.append((current, current_sizes))
    return groups


def chunk_sessions(
    history: Dialogue | Session | Iterable[Session],
    namespace: Sequence[str],
    max_tokens: int,
    *,
    skip_queries: bool = False,
    context: Sequence[Turn] = (),
) -> list[Chunk]:
    """Return the history's chunks in order; ``skip_queries`` leaves out query turns.

    ``context``: earlier turns of the conversation (online memory), read by the
    guard only, so a request announced in an earlier message still flags the next;
    a session's own ``meta["earlier"]`` (the user's earlier messages) serves when none is given.
    """
    chunks: list[Chunk] = []
    for session in as_sessions(history):
        turns = [t for t in session.turns if not (skip_queries and t.is_query)]
        earlier = context or [
            Turn(id=f"earlier-{i}", role="user", text=str(t)) for i, t in enumerate(session.meta.get("earlier") or [])
        ]
        flags = flag_turns(turns, context=earlier)
        reasons = {tid: f"asks to change your memory or beliefs ({f['kind']})" for tid, f in flags.items()}
        claims = turn_claims(turns, context=earlier)
        for group, sizes in split_turns(turns, max_tokens, reasons):
            ids = [t.id for t in group]
            chunks.append(
                Chunk(
                    id=chunk_id(namespace, session.id, ids),
                    index=len(chunks),
                    session_id=session.id,
                    time=session.time,
                    turn_ids=ids,
                    user_turn_ids=[t.id for t in group if t.role == "user"],
                    text=format_chunk(group, session_id=session.id, time=session.time, flags=reasons),
                    tokens=sum(sizes),
                    flagged=[flags[i] for i in ids if i in flags],
                    claims=[c for c in claims if c["turn_id"] in ids],
                    said={t.id: f"{speaker_label(t)}: {t.text[:QUOTE_CHARS]}" for t in group},
                )
            )
    return chunks
