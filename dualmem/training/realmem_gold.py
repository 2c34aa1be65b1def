"""SFT targets from RealMem's gold: each session's extracted memory points, written where their source turn is.

RealMem annotates every session with memory points (``"User is working on an R
learning plan for their thesis."``), each with the 1-based index of the turn it
comes from. Those are facts about the user, as the writer prompt asks, so they
become the writer's target as they are: a history is cut into chunks exactly as
the writer cuts it, the chunk holding a point's source turn ADDs it (citing that
turn), and the gold is written through the writer's core on the in-memory store
(:class:`~dualmem.training.writing.EpisodeMemory`): each chunk's prompt is the
product's prompt for the product's view of the gold written so far, and a
target keeps only what the writer's rules accept
(:func:`~dualmem.training.episode.write_target`; a point the dedup rule merges
into an earlier one is still ADDed, as the writer would).

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

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dualmem.context import Context
from dualmem.memory.chunking import Chunk, chunk_sessions
from dualmem.memory.view import View
from dualmem.schema import Dataset, DatasetItem, FactOp, MemoryUpdate, Session
from dualmem.training.episode import Episode, GoldFact, episode_namespace, episode_persona, fraction, write_target
from dualmem.training.writing import EpisodeMemory, Seed, writer_context

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
    """One chunk of a gold walk through a history: the memory before it (when kept), its prompt and view, its target."""

    index: int
    chunk: Chunk
    before: Seed | None
    messages: list[dict[str, str]]
    view: View
    target: MemoryUpdate
    points: list[tuple[str, str, str]]  # (point id, text, first turn id) of each point the target writes


def gold_walk(
    item: DatasetItem,
    *,
    ctx: Context | None = None,
    chunk_tokens: int | None = None,
    max_chunks: int | None = None,
    notes: Counter[str] | None = None,
    keep_start: Callable[[int], bool] = lambda n: False,
) -> Iterator[GoldChunk]:
    """Walk the first ``max_chunks`` chunks of ``item``'s history writing its memory points where their source turn is.

    ``ctx``: the writer's context (chunk size, view, embedder; default :func:`~dualmem.training.writing.writer_context`),
    ``chunk_tokens`` overriding its chunk size; ``keep_start(n)``: keep the memory before chunk ``n`` (:attr:`GoldChunk.before`).
    """
    ctx = writer_context(ctx, chunk_tokens=chunk_tokens)
    dialogue = item.dialogue
    persona = episode_persona(item)
    sessions = list(dialogue.sessions)
    at = point_turns(sessions)
    namespace = episode_namespace(item)
    chunks = chunk_sessions(sessions, namespace, ctx.settings.tuning.chunk_tokens)
    memory = EpisodeMemory(ctx, namespace, persona)
    for n, chunk in enumerate(chunks[:max_chunks]):
        points: dict[
            str, tuple[str, list[str]]
        ] = {}  # text -> (point id, turn ids); a point said twice is written once
        for turn_id in chunk["turn_ids"]:
            for pid, text in at.get(turn_id, []):
                points.setdefault(text, (pid, []))[1].append(turn_id)
        before = memory.seed() if keep_start(n) else None
        messages, view = memory.draft(chunk)
        facts = [
            FactOp(op="ADD", id=f"N{i}", text=text[:300], turn_ids=turns)
            for i, (text, (_, turns)) in enumerate(points.items(), 1)
        ]
        target, _ = write_target(memory, chunk, view, MemoryUpdate(facts=facts, insights=[]), notes)
        kept = {f.id for f in target.facts}
        wrote = [(pid, text, turns[0]) for i, (text, (pid, turns)) in enumerate(points.items(), 1) if f"N{i}" in kept]
        yield GoldChunk(n, chunk, before, messages, view, target, wrote)


def item_records(item: DatasetItem, *, keep_empty: float = 0.2, **walk: Any) -> list[dict[str, Any]]:
    """Return one persona's SFT records (keyword arguments: :func:`gold_walk`; ``keep_empty``: share of chunks without points kept)."""
    persona = episode_persona(item)
    records = []
    for step in gold_walk(item, **walk):
        if not step.target.facts and fraction("empty", step.chunk["id"]) >= keep_empty:
            continue
        messages = [*step.messages, {"role": "assistant", "content": step.target.model_dump_json()}]
        records.append(
            {
                "messages": messages,
                "persona_id": persona.id,
                "episode_id": item.dialogue.id,
                "chunk_id": step.chunk["id"],
                "source": "realmem-gold",
                "loss_scope": LOSS_SCOPE,
                "points": [pid for pid, _, _ in step.points],
            }
        )
    return records


def realmem_episodes(item: DatasetItem, *, window: int = 1, skip: int = 0, **walk: Any) -> list[Episode]:
    """Return short GRPO episodes of one persona: runs of ``window`` consecutive chunks, from chunk ``skip`` on, holding a memory point.

    Each starts from the gold memory written before it (as SFT's working views do; keyword arguments: :func:`gold_walk`); its
    gold facts are the memory points of its chunks, each at its source turn; only the facts it writes are scored (RealMem has
    no gold insights).
    """
    step = max(1, window)
    persona = episode_persona(item)
    steps = list(gold_walk(item, keep_start=lambda n: n >= skip and (n - skip) % step == 0, **walk))
    episodes = []
    for first in range(skip, len(steps), step):
        run = steps[first : first + step]
        gold = [GoldFact(pid, text, turn) for s in run for pid, text, turn in s.points]
        if gold:
            episodes.append(
                Episode(
                    f"{item.dialogue.id}#{run[0].index}",
                    persona,
                    episode_namespace(item),
                    [s.chunk for s in run],
                    [],
                    gold,
                    start=run[0].before or Seed(),
                    scored=("fact",),
                )
            )
    return episodes


def realmem_records(dataset: Dataset, *, progress: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
    """Return the SFT records of every history of a RealMem dataset (keyword arguments: :func:`item_records`)."""
    from tqdm.auto import tqdm

    return [
        r
        for item in tqdm(dataset.items, desc="export RealMem", unit="persona", disable=not progress)
        for r in item_records(item, **kwargs)
    ]


def facts_prefix(target: str) -> int:
    """Return the length of a target's facts part: everything before the ``"insights"`` key's value.

    >>> t = '{"facts":[{"op":"ADD","id":"N1","text":"User likes R.","turn_ids":[]}],"insights":[]}'
    >>> t[: facts_prefix(t)]
    '{"facts":[{"op":"ADD","id":"N1","text":"User likes R.","turn_ids":[]}],"insights":'
    """
    key = '"insights":'
    at = target.rfind(key)
    return at + len(key) if at >= 0 else len(target)
