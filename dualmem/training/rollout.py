"""One writing trajectory and the pool that serves its turns; shared by the TRL and VeRL engines.

A :class:`Trajectory` is one rollout of an episode: per chunk, the product's
working view of its own memory and the writer's prompt for it, the prompt and
completion token ids, and the answer written through the writer's core into
its :class:`~dualmem.training.writing.EpisodeMemory`; at the end, the episode
reward. A :class:`TrajectoryPool` hands turn *t* of an episode
to GRPO samples: each request for (episode, t) claims the first trajectory
whose turn *t* is not served yet, or starts a new one. So the *G* samples of a
group get *G* different trajectories, and the next turn's group gets the same
*G* trajectories again — every writing turn is credited with its own
trajectory's episode reward (MemAgent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dualmem.memory.chunking import Chunk
from dualmem.memory.view import View
from dualmem.training.episode import Episode
from dualmem.training.rewards import RewardConfig, episode_reward
from dualmem.training.writing import EpisodeMemory


@dataclass
class Trajectory:
    """One rollout of an episode: its own memory, and per writing turn the token ids and the answer."""

    memory: EpisodeMemory
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float] | None] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"unparseable": 0, "invalid": 0, "dangling": 0})
    reward: dict[str, Any] = field(default_factory=dict)

    def draft(self, chunk: Chunk) -> tuple[list[dict[str, str]], View]:
        """Return the writer's prompt for ``chunk`` and the product's working view of this trajectory's memory."""
        return self.memory.draft(chunk)

    def record(
        self,
        chunk: Chunk,
        view: View,
        prompt_ids: list[int],
        completion_ids: list[int],
        text: str,
        logprobs: list[float] | None = None,
    ) -> None:
        """Store one writing turn and write its answer through the writer's core (bad output is counted, never dropped silently)."""
        self.prompt_ids.append(list(prompt_ids))
        self.completion_ids.append(list(completion_ids))
        self.logprobs.append(logprobs)
        self.texts.append(text)
        turn = self.memory.write(chunk, view, text)
        for key in self.counts:
            self.counts[key] += getattr(turn, key)

    def finish(self, episode: Episode, cfg: RewardConfig, embed: Any = None, judge: Any = None) -> dict[str, Any]:
        """Score what the trajectory wrote (:meth:`Episode.written`); return and keep the reward breakdown."""
        out = episode_reward(
            episode.written(self.memory),
            episode.ground_truth(),
            cfg=cfg,
            embed=embed,
            judge=judge,
            turns=len(self.texts),
            **self.counts,
        )
        self.reward = out.as_dict()
        return self.reward

    def metrics(self) -> dict[str, float]:
        """Return the numeric reward terms (missing recall/judge as -1, so every sample has every key)."""
        keys = ("score", "dense", "fact_recall", "insight_recall", "penalty", "similarity", "parsed_share", "items")
        return {k: float(self.reward[k]) if self.reward.get(k) is not None else -1.0 for k in keys}


@dataclass
class Claim:
    """A pool entry: a trajectory (or a future of one) and the turns already served from it."""

    value: Any
    served: set[int] = field(default_factory=set)


class TrajectoryPool:
    """Hand out each turn of each trajectory exactly once."""

    def __init__(self) -> None:
        self.entries: dict[str, list[Claim]] = {}

    def claim(self, episode_id: str, turn: int, turns: int, make: Any) -> tuple[Claim, bool]:
        """Return (entry, created): an entry whose ``turn`` was unserved, or a new one holding ``make()``."""
        entries = self.entries.setdefault(episode_id, [])
        for entry in entries:
            if turn not in entry.served:
                entry.served.add(turn)
                self._gc(episode_id, turns)
                return entry, False
        entry = Claim(make(), {turn})
        entries.append(entry)
        self._gc(episode_id, turns)
        return entry, True

    def _gc(self, episode_id: str, turns: int) -> None:
        self.entries[episode_id] = [e for e in self.entries[episode_id] if len(e.served) < turns]
