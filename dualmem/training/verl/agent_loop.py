"""VeRL agent loop of the recurrent writer: chunk -> MemoryUpdate, memory carried, episode reward on every turn.

VeRL 0.9 trains one (prompt, response) sequence per agent-loop run. The writer
re-prompts per chunk (persona + its own bounded working view + the chunk), so
a whole episode is not one growing conversation. Each dataset row is one
writing turn (episode, t); for a row the loop claims a trajectory from a
per-worker :class:`~dualmem.training.rollout.TrajectoryPool`: the first of the
group's ``n`` requests for turn t that finds no unserved trajectory starts
playing a new episode (every chunk generated through VeRL's rollout server,
each answer written through the product's writer core into the trajectory's
own :class:`~dualmem.training.writing.EpisodeMemory`: the product's view,
prompt, plan rules and op cap), the others share it turn by turn. The row
returns that trajectory's turn-t prompt, response and log-probs with
``reward_score`` = the trajectory's episode reward — every writing turn is
credited with its trajectory's reward, as in MemAgent. Reward terms go to
``reward_extra_info`` for VeRL's metrics.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
)

from dualmem.config import setting_default
from dualmem.training.rewards import RewardConfig
from dualmem.training.rollout import Trajectory, TrajectoryPool
from dualmem.training.verl.config import AGENT_NAME
from dualmem.training.verl.dataset import StoredEpisode, load_episodes
from dualmem.training.writing import writer_context

POOL = TrajectoryPool()  # per worker process: turns of one trajectory are served to the rows of one episode


@lru_cache(maxsize=4)
def _episodes(path: str) -> dict[str, StoredEpisode]:
    return load_episodes(path)


def _register(cls: type) -> type:
    """Register the loop under its name unless ``agent_loop.yaml`` already did.

    VeRL's workers load ``agent_loop.yaml`` (the entry with ``episodes_path``) before the first agent loop is
    built, and building it imports this module: VeRL's ``register`` decorator would then replace the entry with
    a bare one, and every later loop would be built without its episodes.
    """
    _agent_loop_registry.setdefault(AGENT_NAME, {"_target_": f"{cls.__module__}.{cls.__qualname__}"})
    return cls


@_register
class DualMemWriterAgentLoop(AgentLoopBase):
    """Play writer episodes through VeRL's rollout server and serve them one writing turn per row."""

    def __init__(
        self,
        *args: Any,
        episodes_path: str = "",
        view_k: int = setting_default("view_k"),
        view_recent: int = setting_default("view_recent"),
        memory_embedder: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not episodes_path:
            raise ValueError(
                "agent loop config needs episodes_path (written by `dualmem train rl --engine verl --prepare`)"
            )
        self.episodes_path = str(episodes_path)
        self.view_k, self.view_recent = int(view_k), int(view_recent)
        self.ctx = writer_context(embedder=str(memory_embedder or ""), view_k=self.view_k, view_recent=self.view_recent)
        self.response_length = self.rollout_config.response_length
        reward_kwargs = dict(self.config.reward.custom_reward_function.get("reward_kwargs") or {})
        self.reward_config = RewardConfig.from_dict(reward_kwargs)

    async def _tokens(self, messages: list[dict[str, str]]) -> list[int]:
        return list(await self.ct_build_initial_tokens(messages))

    async def play(self, episode: StoredEpisode, sampling_params: dict[str, Any]) -> Trajectory:
        """Write the whole episode chunk by chunk with the policy; score the final memory."""
        traj = Trajectory(episode.memory(self.ctx))
        for chunk in episode.chunks:
            messages, view = traj.draft(chunk)
            prompt_ids = await self._tokens(messages)
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params
            )
            ids = list(out.token_ids)[: self.response_length]
            logprobs = list(out.log_probs)[: self.response_length] if out.log_probs else None
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            traj.record(chunk, view, prompt_ids, ids, text, logprobs)
        await asyncio.to_thread(traj.finish, episode, self.reward_config)
        return traj

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Return writing turn ``extra_info.turn`` of a trajectory of ``extra_info.episode_id``."""
        info = kwargs["extra_info"]
        episode = _episodes(self.episodes_path)[info["episode_id"]]
        turn = int(info["turn"])
        loop = asyncio.get_running_loop()
        claim, created = POOL.claim(episode.id, turn, len(episode.chunks), loop.create_future)
        if created:
            try:
                claim.value.set_result(await self.play(episode, sampling_params))
            except Exception as exc:  # every waiter of this trajectory must see the failure
                claim.value.set_exception(exc)
                raise
        traj: Trajectory = await claim.value
        response = traj.completion_ids[turn]
        return AgentLoopOutput(
            prompt_ids=traj.prompt_ids[turn],
            response_ids=response,
            response_mask=[1] * len(response),
            response_logprobs=traj.logprobs[turn],
            reward_score=float(traj.reward["score"]),
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": traj.metrics(), "turn_scores": [], "tool_rewards": []},
        )
