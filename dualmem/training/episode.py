"""Writing episodes for training: a history cut into chunks, gold per chunk, and a memory simulator.

One *episode* is a persona's history cut into writer chunks exactly like the
writer graph does, with each query's gold fragments located in the turn that
reveals them. :class:`MemoryState` replays ``MemoryUpdate`` answers in memory
(ADD / UPDATE / DELETE, local ids ``F1``/``I1`` in the view, new labels
``N1``/``M1`` in an update), so SFT export, the rewards and both RL engines
share one notion of "the memory this writer wrote" without a database.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from dualmem.config import setting_default
from dualmem.schema import DatasetItem, FactOp, InsightOp, MemoryUpdate, Persona, Query, Session, Turn, stable_id
from dualmem.training.prompting import chunk_sessions, render_messages, view_text
from dualmem.training.targets import about_user

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


# --------------------------------------------------------------------------- memory simulator


@dataclass
class SimItem:
    """One fact or insight held by the simulator."""

    id: str
    kind: str
    text: str
    grounding: list[str] = field(default_factory=list)
    turn_ids: list[str] = field(default_factory=list)
    order: int = 0


@dataclass
class ApplyStats:
    """What happened when an update was applied."""

    applied: int = 0
    invalid: int = 0
    dangling: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class View:
    """A rendered working view and its local-id map (``F1`` -> item id)."""

    text: str
    ids: dict[str, str]


class MemoryState:
    """Replay writer updates in memory; the stand-in for the store during training."""

    def __init__(self, items: list[SimItem] | None = None) -> None:
        self.items: dict[str, SimItem] = {i.id: i for i in items or []}
        self._order = max((i.order for i in items or []), default=0)

    def copy(self) -> MemoryState:
        """Return an independent copy."""
        return MemoryState([SimItem(**vars(i)) for i in self.items.values()])

    def facts(self) -> list[SimItem]:
        """Return the active facts, oldest first."""
        return sorted((i for i in self.items.values() if i.kind == "fact"), key=lambda i: i.order)

    def insights(self) -> list[SimItem]:
        """Return the active insights, oldest first."""
        return sorted((i for i in self.items.values() if i.kind == "insight"), key=lambda i: i.order)

    def texts(self) -> list[str]:
        """Return every active item's text."""
        return [i.text for i in self.items.values()]

    def view(self, chunk_text: str, *, view_k: int = 8, view_recent: int = 4, must: tuple[str, ...] = ()) -> View:
        """Render a bounded view: items in ``must``, the ``view_k`` most relevant and ``view_recent`` newest per stream."""
        ids: dict[str, str] = {}
        shown: dict[str, list[SimItem]] = {}
        for kind, items, prefix in (("fact", self.facts(), "F"), ("insight", self.insights(), "I")):
            ranked = sorted(items, key=lambda i: (-overlap(i.text, chunk_text), -i.order))
            chosen = {i.id for i in items if i.id in must}
            chosen |= {i.id for i in ranked[:view_k]} | {i.id for i in items[-view_recent:]} if items else set()
            picked = [i for i in items if i.id in chosen]
            shown[kind] = picked
            for n, item in enumerate(picked, 1):
                ids[f"{prefix}{n}"] = item.id
        back = {v: k for k, v in ids.items()}
        facts = [(back[i.id], i.text) for i in shown["fact"]]
        insights = [(back[i.id], i.text, [back.get(g, g) for g in i.grounding]) for i in shown["insight"]]
        return View(view_text(facts, insights), ids)

    def apply(self, update: MemoryUpdate, view: View, chunk_id: str) -> ApplyStats:
        """Apply ``update`` against ``view``; count invalid ops and dangling citations instead of raising."""
        stats = ApplyStats()
        new: dict[str, str] = {}
        for fact in update.facts:
            self._fact(fact, view, chunk_id, new, stats)
        for insight in update.insights:
            self._insight(insight, view, chunk_id, new, stats)
        return stats

    def _next(self) -> int:
        self._order += 1
        return self._order

    def _target(self, kind: str, action: str, local_id: str, view: View, stats: ApplyStats) -> str | None:
        """Return the item a view id names for an UPDATE or DELETE of ``kind``; None (counted invalid) when it names none."""
        target = view.ids.get(local_id)
        if target is None or target not in self.items or not local_id.startswith(kind[0].upper()):
            stats.invalid += 1
            stats.errors.append(f"{kind} {action} {local_id}: not {'an' if kind == 'insight' else 'a'} {kind} id of the view")
            return None
        return target

    def _fact(self, op: FactOp, view: View, chunk_id: str, new: dict[str, str], stats: ApplyStats) -> None:
        if op.op == "ADD":
            if not op.text.strip():
                stats.invalid += 1
                stats.errors.append(f"fact {op.id}: ADD without text")
                return
            item_id = stable_id(chunk_id, "fact", op.id, prefix="f_")
            self.items[item_id] = SimItem(item_id, "fact", op.text, [], list(op.turn_ids), self._next())
            new[op.id] = item_id
            return
        target = self._target("fact", op.op, op.id, view, stats)
        if target is None:
            return
        if op.op == "DELETE":
            del self.items[target]
        else:
            self.items[target].text = op.text or self.items[target].text
        stats.applied += 1

    def _insight(self, op: InsightOp, view: View, chunk_id: str, new: dict[str, str], stats: ApplyStats) -> None:
        if op.op == "DELETE":
            target = self._target("insight", op.op, op.id, view, stats)
            if target is None:
                return
            del self.items[target]
            stats.applied += 1
            return
        grounding = []
        for fid in op.fact_ids:
            ref = new.get(fid) or (view.ids.get(fid) if fid.startswith("F") else None)
            if ref is None or ref not in self.items:
                stats.dangling += 1
                stats.errors.append(f"insight {op.id}: cites unknown fact {fid}")
            else:
                grounding.append(ref)
        if not grounding or not op.text.strip():
            stats.invalid += 1
            stats.errors.append(f"insight {op.id}: no valid fact cited or empty text")
            return
        if op.op == "UPDATE":
            target = self._target("insight", op.op, op.id, view, stats)
            if target is None:
                return
            self.items[target].text, self.items[target].grounding = op.text, grounding
        else:
            item_id = stable_id(chunk_id, "insight", op.id, prefix="i_")
            self.items[item_id] = SimItem(item_id, "insight", op.text, grounding, [], self._next())
        stats.applied += 1


# --------------------------------------------------------------------------- episodes


@dataclass
class Chunk:
    """Consecutive turns the writer sees at once."""

    id: str
    turns: list[Turn]
    text: str


@dataclass
class GoldFact:
    """A gold fragment and the turn revealing it."""

    query_id: str
    text: str
    turn_id: str | None


@dataclass
class Episode:
    """A persona's history as writer chunks, with the gold memory it should produce."""

    id: str
    persona: Persona
    chunks: list[Chunk]
    queries: list[Query]
    gold_facts: list[GoldFact]
    start: list[SimItem] = field(default_factory=list)  # the memory before the first chunk (a window of a longer history)
    scored: tuple[str, ...] = ("fact", "insight")  # kinds of written items the reward compares with the gold

    def initial_state(self) -> MemoryState:
        """Return a fresh copy of the memory the episode starts from."""
        return MemoryState([SimItem(**vars(i)) for i in self.start])

    def written(self, state: MemoryState) -> list[str]:
        """Return the texts of the scored items the episode's turns wrote (added or changed; not the starting memory)."""
        before = {(i.id, i.text) for i in self.start}
        return [i.text for i in state.items.values() if i.kind in self.scored and (i.id, i.text) not in before]

    def chunk_of(self, turn_id: str | None) -> int | None:
        """Return the index of the chunk holding ``turn_id``."""
        for n, chunk in enumerate(self.chunks):
            if any(t.id == turn_id for t in chunk.turns):
                return n
        return None

    def messages(self, view: View, chunk: Chunk) -> list[dict[str, str]]:
        """Return the writer's exact prompt for ``chunk`` as role/content dicts."""
        return render_messages(self.persona, view.text, chunk.text)

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


def build_episode(item: DatasetItem, *, chunk_tokens: int = setting_default("chunk_tokens")) -> Episode:
    """Cut ``item``'s history into writer chunks and locate each gold fragment's turn."""
    dialogue = item.dialogue
    persona = dialogue.persona or Persona(id=dialogue.id, name=dialogue.id)
    sessions: list[Session] = list(dialogue.sessions)
    namespace = (persona.id, dialogue.user_id)
    chunks = [Chunk(cid, turns, text) for cid, turns, text in chunk_sessions(sessions, chunk_tokens, namespace)]
    turns = {t.id: t for s in sessions for t in s.turns}
    gold = [
        GoldFact(q.id, frag, _locate(q, n, frag, turns)) for q in item.queries for n, frag in enumerate(q.gold.facts)
    ]
    return Episode(dialogue.id, persona, chunks, list(item.queries), gold)


@dataclass
class GoldStep:
    """One chunk of a gold walk-through: the view shown and the target update."""

    chunk: Chunk
    view: View
    target: MemoryUpdate
    index: int


def gold_steps(episode: Episode, *, view_k: int = 8, view_recent: int = 4) -> list[GoldStep]:
    """Walk the episode writing gold memory: ADD fragments where they appear (as sentences about the user), the insight once all are seen."""
    state = MemoryState()
    written: dict[str, str] = {}  # fragment text -> item id
    done: set[str] = set()
    steps = []
    for n, chunk in enumerate(episode.chunks):
        here = [g for g in episode.gold_facts if episode.chunk_of(g.turn_id) == n]
        new_texts = list(dict.fromkeys(g.text for g in here if g.text not in written))
        due = []
        for q in episode.queries:
            frags = q.gold.facts
            if q.id in done or not q.gold.insight or not frags:
                continue
            seen = all(f in written or f in new_texts for f in frags)
            located = all(g.turn_id is not None for g in episode.gold_facts if g.query_id == q.id)
            if seen and located:
                due.append(q)
        must = tuple(written[f] for q in due for f in q.gold.facts if f in written)
        view = state.view(chunk.text, view_k=view_k, view_recent=view_recent, must=must)
        back = {v: k for k, v in view.ids.items()}
        labels = {text: f"N{i}" for i, text in enumerate(new_texts, 1)}
        said = {about_user(t): t for t in new_texts}  # the writer writes facts about the user, not the user's own words
        facts = [
            FactOp(op="ADD", id=labels[t], text=about_user(t), turn_ids=sorted({g.turn_id for g in here if g.text == t and g.turn_id}))
            for t in new_texts
        ]
        insights = [
            InsightOp(op="ADD", id=f"M{i}", text=q.gold.insight or "", fact_ids=[labels.get(f) or back[written[f]] for f in q.gold.facts])
            for i, q in enumerate(due, 1)
        ]
        target = MemoryUpdate(facts=facts, insights=insights)
        steps.append(GoldStep(chunk, view, target, n))
        before = set(state.items)
        state.apply(target, view, chunk.id)
        added = [state.items[i] for i in state.items if i not in before and state.items[i].kind == "fact"]
        for item in added:
            written[said.get(item.text, item.text)] = item.id
        done |= {q.id for q in due}
    return steps
