"""SFT targets from RealMem's gold: each session's extracted memory points, written where their source turn is.

RealMem annotates every session with memory points (``"User is working on an R
learning plan for their thesis."``), each with the 1-based index of the turn it
comes from. Those are facts about the user, as the writer prompt asks, so they
become the writer's target as they are: a history is cut into chunks exactly as
the writer cuts it, the chunk holding a point's source turn ADDs it (citing that
turn), and the working view shown with each chunk is simulated from the gold
written so far (:class:`~dualmem.training.episode.MemoryState`).

RealMem has no gold insights. A target's ``insights`` list is therefore empty
and marked out of the loss (``"loss_scope": "facts"``): :mod:`dualmem.training.sft`
trains on the facts part of the answer only, so the insight stream keeps the
base model's behaviour instead of learning to write none.

The same walk gives GRPO its short episodes (:func:`realmem_episodes`): windows
of a few chunks that hold memory points, each starting from the gold memory
written before it. Their reward scores only the facts a rollout writes against
the window's points; insights are neither rewarded nor compared with anything
(there is no gold to compare them with), only their citations are checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dualmem.config import setting_default
from dualmem.schema import Dataset, DatasetItem, FactOp, MemoryUpdate, Persona, Session
from dualmem.training.episode import Chunk, Episode, GoldFact, MemoryState, View, fraction
from dualmem.training.prompting import chunk_sessions, render_messages

LOSS_SCOPE = "facts"  # the part of a target that is trained on when the gold has no insights


def point_turns(sessions: list[Session]) -> dict[str, list[tuple[str, str]]]:
    """Return ``{turn id: [(point id, point text), ...]}``: each memory point at its source turn.

    A point without a usable ``source_turn`` goes to the session's last user turn (it was said in that session).
    """
    out: dict[str, list[tuple[str, str]]] = {}
    for s in sessions:
        users = [t for t in s.turns if t.role == "user"] or s.turns
        for p in s.memory_points:
            if not p.content.strip() or not users:
                continue
            n = p.source_turn
            turn = s.turns[n - 1] if n is not None and 0 < n <= len(s.turns) else users[-1]
            out.setdefault(turn.id, []).append((p.id, p.content.strip()))
    return out


@dataclass
class GoldChunk:
    """One chunk of a gold walk through a history: the memory before it, its view and its target update."""

    index: int
    chunk: Chunk
    before: MemoryState
    view: View
    target: MemoryUpdate
    points: list[tuple[str, str, str]]  # (point id, text, first turn id) of each point the target writes


def gold_walk(item: DatasetItem, *, chunk_tokens: int = setting_default("chunk_tokens"), view_k: int = 8, view_recent: int = 4,
              max_chunks: int | None = None) -> Iterator[GoldChunk]:
    """Walk the first ``max_chunks`` chunks of ``item``'s history writing its memory points where their source turn is."""
    dialogue = item.dialogue
    persona = dialogue.persona or Persona(id=dialogue.id, name=dialogue.id)
    sessions = list(dialogue.sessions)
    at = point_turns(sessions)
    chunks = [Chunk(cid, turns, text) for cid, turns, text in chunk_sessions(sessions, chunk_tokens, (persona.id, dialogue.user_id))]
    state = MemoryState()
    for n, chunk in enumerate(chunks[:max_chunks]):
        points: dict[str, tuple[str, list[str]]] = {}  # text -> (point id, turn ids); a point said twice is written once
        for turn in chunk.turns:
            for pid, text in at.get(turn.id, []):
                points.setdefault(text, (pid, []))[1].append(turn.id)
        before = state.copy()
        view = state.view(chunk.text, view_k=view_k, view_recent=view_recent)
        facts = [FactOp(op="ADD", id=f"N{i}", text=text[:300], turn_ids=turns) for i, (text, (_, turns)) in enumerate(points.items(), 1)]
        target = MemoryUpdate(facts=facts, insights=[])
        state.apply(target, view, chunk.id)
        yield GoldChunk(n, chunk, before, view, target, [(pid, text, turns[0]) for text, (pid, turns) in points.items()])


def item_records(item: DatasetItem, *, keep_empty: float = 0.2, **walk: Any) -> list[dict[str, Any]]:
    """Return one persona's SFT records (keyword arguments: :func:`gold_walk`; ``keep_empty``: share of chunks without points kept)."""
    dialogue = item.dialogue
    persona = dialogue.persona or Persona(id=dialogue.id, name=dialogue.id)
    records = []
    for step in gold_walk(item, **walk):
        if not step.target.facts and fraction("empty", step.chunk.id) >= keep_empty:
            continue
        messages = render_messages(persona, step.view.text, step.chunk.text)
        messages.append({"role": "assistant", "content": step.target.model_dump_json()})
        records.append({
            "messages": messages, "persona_id": persona.id, "episode_id": dialogue.id, "chunk_id": step.chunk.id,
            "source": "realmem-gold", "loss_scope": LOSS_SCOPE, "points": [pid for pid, _, _ in step.points],
        })
    return records


def realmem_episodes(item: DatasetItem, *, window: int = 1, skip: int = 0, **walk: Any) -> list[Episode]:
    """Return short GRPO episodes of one persona: runs of ``window`` consecutive chunks, from chunk ``skip`` on, holding a memory point.

    Each starts from the gold memory written before it (as SFT's working views do); its gold facts are the memory
    points of its chunks, each at its source turn; only the facts it writes are scored (RealMem has no gold insights).
    """
    dialogue = item.dialogue
    persona = dialogue.persona or Persona(id=dialogue.id, name=dialogue.id)
    steps = list(gold_walk(item, **walk))
    episodes = []
    for first in range(skip, len(steps), max(1, window)):
        run = steps[first : first + max(1, window)]
        gold = [GoldFact(pid, text, turn) for s in run for pid, text, turn in s.points]
        if gold:
            episodes.append(Episode(f"{dialogue.id}#{run[0].index}", persona, [s.chunk for s in run], [], gold,
                                    start=list(run[0].before.items.values()), scored=("fact",)))
    return episodes


def realmem_records(dataset: Dataset, *, progress: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
    """Return the SFT records of every history of a RealMem dataset (keyword arguments: :func:`item_records`)."""
    from tqdm.auto import tqdm

    return [r for item in tqdm(dataset.items, desc="export RealMem", unit="persona", disable=not progress) for r in item_records(item, **kwargs)]


def facts_prefix(target: str) -> int:
    """Return the length of a target's facts part: everything before the ``"insights"`` key's value.

    >>> t = '{"facts":[{"op":"ADD","id":"N1","text":"User likes R.","turn_ids":[]}],"insights":[]}'
    >>> t[: facts_prefix(t)]
    '{"facts":[{"op":"ADD","id":"N1","text":"User likes R.","turn_ids":[]}],"insights":'
    """
    key = '"insights":'
    at = target.rfind(key)
    return at + len(key) if at >= 0 else len(target)
