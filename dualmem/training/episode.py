"""Writing episodes for training: a history cut into the writer's chunks, its gold, and the gold walk-through.

One *episode* is a persona's history cut into chunks exactly as
:func:`~dualmem.writer.history.write_history` cuts it (the product's
:class:`~dualmem.memory.chunking.Chunk`, with the guard's flags), each query's
gold fragments located in the turn that reveals them, and the memory it starts
from (a :class:`~dualmem.training.writing.Seed`; empty for a whole history).
Every rollout writes its own :class:`~dualmem.training.writing.EpisodeMemory`
of the episode: the product's store, view, prompt and plan rules.

:func:`gold_steps` walks an episode writing its gold through the same memory,
so every SFT prompt is the product's prompt for the product's view.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dualmem.config import setting_default
from dualmem.context import Context
from dualmem.memory.chunking import Chunk, chunk_sessions
from dualmem.memory.view import View
from dualmem.schema import DatasetItem, FactOp, InsightOp, MemoryItem, MemoryUpdate, Persona, Query, Turn
from dualmem.training.targets import about_user
from dualmem.training.writing import EpisodeMemory, Seed, writer_context
from dualmem.writer.core import ChunkRow

WORD = re.compile(r"\w+")


def fraction(*parts: object) -> float:
    """Return a deterministic number in [0, 1] for ``parts`` (sampling and splits that do not depend on a seed's state)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()
    return int(digest[:8], 16) / 0xFFFFFFFF


def _words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if len(w) > 2}


def overlap(a: str, b: str) -> float:
    """Return the share of ``a``'s content words found in ``b`` (0..1)."""
    wa = _words(a)
    return len(wa & _words(b)) / len(wa) if wa else 0.0


@dataclass
class GoldFact:
    """A gold fragment and the turn revealing it."""

    query_id: str
    text: str
    turn_id: str | None


@dataclass
class Episode:
    """A persona's history as writer chunks, with the gold memory it should produce and the memory it starts from."""

    id: str
    persona: Persona
    namespace: tuple[str, ...]
    chunks: list[Chunk]
    queries: list[Query]
    gold_facts: list[GoldFact]
    start: Seed = field(default_factory=Seed)  # the memory before the first chunk (a window of a longer history)
    scored: tuple[str, ...] = ("fact", "insight")  # kinds of written items the reward compares with the gold

    def memory(self, ctx: Context) -> EpisodeMemory:
        """Return a fresh memory of one rollout: the starting memory, in its own store."""
        return EpisodeMemory(ctx, self.namespace, self.persona, self.start)

    def new_items(self, memory: EpisodeMemory) -> list[MemoryItem]:
        """Return the active items the episode's turns wrote (added or changed; not the starting memory as it was)."""
        before = {(i.id, i.text) for i in self.start.active()}
        return [i for i in memory.items() if (i.id, i.text) not in before]

    def written(self, memory: EpisodeMemory) -> list[str]:
        """Return the texts of the scored kinds among :meth:`new_items` (what the reward compares with the gold)."""
        return [i.text for i in self.new_items(memory) if i.kind in self.scored]

    def chunk_of(self, turn_id: str | None) -> int | None:
        """Return the index of the chunk holding ``turn_id``."""
        return next((n for n, chunk in enumerate(self.chunks) if turn_id in chunk["turn_ids"]), None)

    def ground_truth(self) -> dict[str, Any]:
        """Return the gold memory of the episode (facts, insights, queries) as plain JSON."""
        return {
            "facts": sorted({g.text for g in self.gold_facts}),
            "insights": [q.gold.insight for q in self.queries if q.gold.insight],
            "queries": [
                {"id": q.id, "text": q.text, "facts": q.gold.facts, "insight": q.gold.insight, "task_type": q.task_type}
                for q in self.queries
            ],
            "persona": self.persona.model_dump(mode="json"),
        }


def _locate(query: Query, index: int, fragment: str, turns: dict[str, Turn]) -> str | None:
    for ev in query.meta.get("evidence", []) or []:
        if isinstance(ev, dict) and ev.get("fragment") == fragment and ev.get("turn_id") in turns:
            return ev["turn_id"]
    gold = [t for t in query.gold.turn_ids if t in turns]
    if len(gold) == len(query.gold.facts):
        return gold[index]
    pool = [turns[t] for t in gold] or [t for t in turns.values() if t.role == "user"]
    best = max(pool, key=lambda t: overlap(fragment, t.text), default=None)
    return best.id if best is not None and overlap(fragment, best.text) > 0 else None


def episode_persona(item: DatasetItem) -> Persona:
    """Return the persona of a history (one named after the history when it has none)."""
    return item.dialogue.persona or Persona(id=item.dialogue.id, name=item.dialogue.id)


def episode_namespace(item: DatasetItem) -> tuple[str, str]:
    """Return the namespace write_history writes a history into: (persona id, the dialogue's user, else the default user)."""
    return episode_persona(item).id, item.dialogue.user_id or setting_default("user_id")


def build_episode(item: DatasetItem, *, chunk_tokens: int = setting_default("chunk_tokens")) -> Episode:
    """Cut ``item``'s history into the writer's chunks (in :func:`episode_namespace`) and locate each gold fragment's turn."""
    dialogue = item.dialogue
    persona = episode_persona(item)
    namespace = episode_namespace(item)
    turns = {t.id: t for s in dialogue.sessions for t in s.turns}
    gold = [
        GoldFact(q.id, frag, _locate(q, n, frag, turns)) for q in item.queries for n, frag in enumerate(q.gold.facts)
    ]
    return Episode(
        dialogue.id,
        persona,
        namespace,
        chunk_sessions(list(dialogue.sessions), namespace, chunk_tokens),
        list(item.queries),
        gold,
    )


# --------------------------------------------------------------------------- gold walk-through


@dataclass
class GoldStep:
    """One chunk of a gold walk-through: the writer's prompt and view, and the target update."""

    chunk: Chunk
    messages: list[dict[str, str]]
    view: View
    target: MemoryUpdate
    index: int


def write_target(
    memory: EpisodeMemory, chunk: Chunk, view: View, target: MemoryUpdate, notes: Counter[str] | None = None
) -> tuple[MemoryUpdate, ChunkRow]:
    """Write a gold target through the writer's rules; return it less every operation they reject, and the chunk's row.

    The returned target is one the writer's plan accepts as it is (each rejection is counted in ``notes``).
    """
    notes = notes if notes is not None else Counter()
    for _ in range(len(target.facts) + len(target.insights) + 1):  # each pass drops at least one rejected operation
        row, plan = memory.decide(chunk, view, target)
        assert plan is not None  # an update given as an object always plans
        if not plan["rejected"]:
            memory.commit(chunk, row, plan)
            return target, row
        gone = {(r["stream"], r["op"], str(r["id"])) for r in plan["rejected"]}
        for r in plan["rejected"]:
            notes[f"gold {r['stream']} {r['op']} rejected by the writer's rules"] += 1
        target = MemoryUpdate(
            facts=[f for f in target.facts if ("fact", f.op, f.id) not in gone],
            insights=[i for i in target.insights if ("insight", i.op, i.id) not in gone],
        )
    raise RuntimeError("write_target: a rejected operation was not found in the target")


def _due(episode: Episode, written: dict[str, str], new: list[str], done: set[str]) -> list[Query]:
    """Return the queries whose insight is due: every fragment located and written before or now, not written yet."""
    due = []
    for q in episode.queries:
        if q.id in done or not q.gold.insight or not q.gold.facts:
            continue
        seen = all(f in written or f in new for f in q.gold.facts)
        located = all(g.turn_id is not None for g in episode.gold_facts if g.query_id == q.id)
        if seen and located:
            due.append(q)
    return due


def gold_steps(episode: Episode, ctx: Context | None = None, notes: Counter[str] | None = None) -> list[GoldStep]:
    """Walk the episode writing its gold memory through the writer's core; return each chunk's prompt, view and target.

    - a chunk ADDs the gold fragments located in it and not written before, as sentences about the user (``N#``);
    - a query's insight is written at the chunk where its last fragment is written (all located), citing each of its
      facts the writer can cite there: ``N#`` for the facts the same update adds, ``F#`` for earlier ones **the
      product's view shows**; earlier facts the view does not show are left out of the citation (counted:
      "insight cites part of its facts"); with none citable the insight is left out (counted). The view is the
      product's, never widened for the gold, so a target cites only what the writer sees;
    - an operation the writer's rules reject (guard, dedup, op cap) is dropped from the target (:func:`write_target`).

    ``ctx``: the writer's context (view size, embedder; default :func:`~dualmem.training.writing.writer_context`).
    """
    memory = episode.memory(ctx or writer_context())
    notes = notes if notes is not None else Counter()
    written: dict[str, str] = {}  # gold fragment -> store id of its fact
    done: set[str] = set()
    steps = []
    for n, chunk in enumerate(episode.chunks):
        messages, view = memory.draft(chunk)
        here = [g for g in episode.gold_facts if episode.chunk_of(g.turn_id) == n]
        new = list(dict.fromkeys(g.text for g in here if g.text not in written))
        labels = {text: f"N{i}" for i, text in enumerate(new, 1)}
        facts = [
            FactOp(
                op="ADD",
                id=labels[t],
                text=about_user(t),
                turn_ids=sorted({g.turn_id for g in here if g.text == t and g.turn_id}),
            )
            for t in new
        ]
        shown = {e["id"]: e["label"] for e in view["facts"]}
        insights: list[InsightOp] = []
        for q in _due(episode, written, new, done):
            done.add(q.id)
            cites = [labels.get(f) or shown.get(written.get(f, "")) for f in q.gold.facts]
            citable = list(dict.fromkeys(c for c in cites if c))
            if not citable:
                notes["insight left out: none of its facts citable"] += 1
                continue
            if any(c is None for c in cites):
                notes["insight cites part of its facts (the others are not in the view)"] += 1
            insights.append(
                InsightOp(op="ADD", id=f"M{len(insights) + 1}", text=q.gold.insight or "", fact_ids=citable)
            )
        target, row = write_target(memory, chunk, view, MemoryUpdate(facts=facts, insights=insights), notes)
        steps.append(GoldStep(chunk, messages, view, target, n))
        text_of = {labels[t]: t for t in new}
        for rec in [*row.get("applied", []), *row.get("merged", [])]:
            if rec["stream"] == "fact" and rec["op"] == "ADD" and rec["id"] in text_of:
                written[text_of[rec["id"]]] = rec.get("store_id") or rec["into"]
    return steps
