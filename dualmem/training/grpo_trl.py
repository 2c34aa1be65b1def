"""GRPO on one machine with TRL: recurrent writing episodes, the episode reward credited to every turn.

How an episode maps onto TRL's ``GRPOTrainer`` (MemAgent-style credit):

- the dataset has one row per (episode, writing turn), in order
  (``shuffle_dataset=False``); a row's prompt is only a key
  ``{"episode": id, "turn": t}``;
- a custom ``rollout_func`` (TRL's experimental hook) receives the rows. The
  first time it meets an episode (or when a new pass over it starts) it plays
  the **whole episode** for each of the ``num_generations`` rollouts of the
  group: the rollouts share the history; each writes its own memory chunk by
  chunk through the product's writer core on its own in-memory store
  (:class:`~dualmem.training.writing.EpisodeMemory`: the product's working
  view and exact prompt, one sampled answer per chunk validated and applied
  as ``write_history`` applies it — dedup, guard, op cap). At the end each
  rollout gets its episode reward (:func:`dualmem.training.rewards.episode_reward`);
- row (episode, t) then returns, for rollout g, the prompt/completion token ids
  of g's turn t, and its reward is g's **episode** reward. GRPO's group
  advantage compares the G rollouts' episode rewards, and every writing turn
  of a rollout is pushed in the same direction, as in MemAgent;
- when the generation batch (``generation_batch_size``) covers a whole
  episode, the turns are trained on-policy; otherwise later turns of an episode
  were sampled a few optimizer steps earlier (mildly off-policy, like
  ``steps_per_generation`` > 1).

Recall terms are logged as zero-weight reward functions (``rewards/fact_recall``…).

RealMem (``--data_format realmem``): episodes are windows of ``--episode_chunks``
chunks that hold memory points, each starting from the gold memory written before
it (:func:`dualmem.training.realmem_gold.realmem_episodes`), so that a group costs a
few writing turns instead of a whole history; only the facts a rollout writes are
scored. ``--grammar true`` samples rollouts under the writer's JSON grammar, as the
bundled model writes in ``dualmem eval`` (at least one fact and one insight per answer).
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dualmem.context import Context
from dualmem.errors import ConfigurationError
from dualmem.schema import Dataset
from dualmem.training.episode import Episode, build_episode
from dualmem.training.rollout import Trajectory, TrajectoryPool
from dualmem.training.run_config import GRPORunConfig


def _ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def _shared_prefill(model: Any, prompts: list[list[int]], input_ids: Any) -> dict[str, Any]:
    """Return ``generate`` kwargs reading one prompt once when every rollout of the group has the same one (its cache, copied)."""
    if len(prompts) < 2 or any(p != prompts[0] for p in prompts):
        return {}
    cache = model(input_ids=input_ids[:1, :-1], use_cache=True).past_key_values
    cache.batch_repeat_interleave(len(prompts))
    return {"past_key_values": cache}


class EpisodeRunner:
    """Play writing episodes with the trainer's policy and serve them turn by turn to TRL.

    ``history`` gets one row per played group: the episode, each rollout's reward terms and what it wrote.
    """

    def __init__(self, episodes: list[Episode], cfg: GRPORunConfig, embed: Any = None, judge: Any = None) -> None:
        self.episodes = {e.id: e for e in episodes}
        self.cfg, self.ctx = cfg, cfg.writer_context()
        self.embed, self.judge = embed, judge
        self.pool = TrajectoryPool()
        self.history: list[dict[str, Any]] = []
        self._grammar: Any = None

    def rows(self) -> list[dict[str, str]]:
        """Return the dataset rows: one per (episode, turn), in order."""
        return [
            {"prompt": json.dumps({"episode": e.id, "turn": t})}
            for e in self.episodes.values()
            for t in range(len(e.chunks))
        ]

    def processors(self, model: Any, tokenizer: Any) -> list[Any]:
        """Return the logits processors of one batched generation: the writer's JSON grammar with ``cfg.grammar``."""
        if not self.cfg.grammar:
            return []
        if self._grammar is None:
            from langchain_core.utils.function_calling import convert_to_json_schema

            from dualmem.models.local.grammar import compile_grammar
            from dualmem.schema import MemoryUpdate

            schema = json.dumps(convert_to_json_schema(MemoryUpdate))  # the schema the writer asks a local model for
            self._grammar = compile_grammar(tokenizer, model.config.vocab_size, schema, self.cfg.max_completion_length)
        from xgrammar.contrib.hf import LogitsProcessor

        return [LogitsProcessor(self._grammar)]

    def play(self, episode: Episode, model: Any, tokenizer: Any, groups: int) -> list[Trajectory]:
        """Play ``episode`` ``groups`` times at once (batched generation), chunk by chunk, and score each."""
        import torch

        from dualmem.models.local.bundled import stop_ids

        clock = time.time(), time.process_time()
        trajectories = [Trajectory(episode.memory(self.ctx)) for _ in range(groups)]
        stops = stop_ids(tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        device = next(model.parameters()).device
        for chunk in episode.chunks:
            drafts = [t.draft(chunk) for t in trajectories]
            prompts = [
                _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
                for messages, _ in drafts
            ]
            width = max(map(len, prompts))
            input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=mask,
                    do_sample=True,
                    temperature=self.cfg.temperature,
                    max_new_tokens=self.cfg.max_completion_length,
                    pad_token_id=pad,
                    eos_token_id=stops,
                    logits_processor=self.processors(model, tokenizer),
                    **_shared_prefill(model, prompts, input_ids),
                )
            for traj, (_, view), prompt, row in zip(
                trajectories, drafts, prompts, out[:, width:].tolist(), strict=True
            ):
                end = next((n for n, tid in enumerate(row) if tid in stops), None)
                completion = (row if end is None else row[: end + 1]) or [tokenizer.eos_token_id]
                traj.record(chunk, view, prompt, completion, tokenizer.decode(completion, skip_special_tokens=True))
        for traj in trajectories:
            traj.finish(episode, self.cfg.reward_config(), embed=self.embed, judge=self.judge)
        self.history.append(self._row(episode, trajectories, clock))
        return trajectories

    @staticmethod
    def _row(episode: Episode, trajectories: list[Trajectory], clock: tuple[float, float]) -> dict[str, Any]:
        """Return the history row of one played group (rewards, recall, items written per kind, seconds, each rollout's answers)."""
        terms = [t.metrics() for t in trajectories]
        wrote = [[i.kind for i in episode.new_items(t.memory)] for t in trajectories]
        return {
            "episode": episode.id,
            "chunks": len(episode.chunks),
            "gold_facts": len(episode.gold_facts),
            **{k: [round(m[k], 4) for m in terms] for k in ("score", "fact_recall", "similarity", "parsed_share")},
            "facts": [w.count("fact") for w in wrote],
            "insights": [w.count("insight") for w in wrote],
            "wall_s": round(time.time() - clock[0], 2),
            "cpu_s": round(time.process_time() - clock[1], 2),
            "texts": [t.texts for t in trajectories],
        }

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL ``rollout_func``: return ids for each (episode, turn) sample and its trajectory's episode reward."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        claims: list[tuple[Any, int]] = []
        fresh: dict[str, list[Any]] = {}
        for prompt in prompts:
            key = json.loads(prompt if isinstance(prompt, str) else prompt[-1]["content"])
            eid, turn = key["episode"], int(key["turn"])
            claim, created = self.pool.claim(eid, turn, len(self.episodes[eid].chunks), lambda: None)
            claims.append((claim, turn))
            if created:
                fresh.setdefault(eid, []).append(claim)
        for eid, new in fresh.items():  # play the new trajectories of an episode in one batch
            for claim, traj in zip(new, self.play(self.episodes[eid], model, tokenizer, len(new)), strict=True):
                claim.value = traj
        out: dict[str, list[Any]] = {
            k: [] for k in ("prompt_ids", "completion_ids", "episode_reward", "fact_recall", "insight_recall")
        }
        for claim, turn in claims:
            traj, terms = claim.value, claim.value.metrics()
            out["prompt_ids"].append(traj.prompt_ids[turn])
            out["completion_ids"].append(traj.completion_ids[turn])
            out["episode_reward"].append(terms["score"])
            out["fact_recall"].append(max(terms["fact_recall"], 0.0))
            out["insight_recall"].append(max(terms["insight_recall"], 0.0))
        return {**out, "logprobs": None}


def episode_reward_func(completions: list[Any], episode_reward: list[float], **kwargs: Any) -> list[float]:
    """Reward of a writing turn: its rollout's episode reward."""
    return list(episode_reward)


def fact_recall(completions: list[Any], fact_recall: list[float], **kwargs: Any) -> list[float]:
    """Logged only (weight 0): fact recall of the rollout's final memory."""
    return list(fact_recall)


def insight_recall(completions: list[Any], insight_recall: list[float], **kwargs: Any) -> list[float]:
    """Logged only (weight 0): insight recall of the rollout's final memory."""
    return list(insight_recall)


def training_episodes(dataset: Dataset, cfg: GRPORunConfig, tokenizer: Any = None) -> list[Episode]:
    """Return the episodes of ``dataset``: whole histories (RoleMemo), or RealMem windows in a seeded order that mixes the personas.

    With ``cfg.max_prompt_tokens`` (and ``tokenizer``), a window is left out when a chunk's prompt, the product's view of the
    window's starting memory, is longer.
    """
    if cfg.data_format != "realmem":
        return [build_episode(item, chunk_tokens=cfg.chunk_tokens) for item in dataset.items]
    from dualmem.training.episode import fraction
    from dualmem.training.realmem_gold import realmem_episodes

    ctx = cfg.writer_context()
    episodes = [
        e
        for item in dataset.items
        for e in realmem_episodes(
            item,
            window=cfg.episode_chunks or 1_000_000,
            skip=cfg.skip_chunks,
            ctx=ctx,
            max_chunks=cfg.max_chunks or None,
        )
    ]
    if cfg.max_prompt_tokens and tokenizer is not None:
        episodes = [e for e in episodes if _prompt_tokens(e, ctx, tokenizer) <= cfg.max_prompt_tokens]
    if not episodes:
        raise ConfigurationError(
            "no RealMem episode holds a memory point within the limits: check --data, --max_chunks, --skip_chunks, --max_prompt_tokens"
        )
    return sorted(episodes, key=lambda e: fraction("grpo-order", cfg.seed, e.id))


def _prompt_tokens(episode: Episode, ctx: Context, tokenizer: Any) -> int:
    """Return the longest prompt of the episode's chunks, each drafted on the episode's starting memory."""
    memory = episode.memory(ctx)
    return max(
        len(_ids(tokenizer.apply_chat_template(memory.draft(c)[0], add_generation_prompt=True, tokenize=True)))
        for c in episode.chunks
    )


def build_trainer(
    cfg: GRPORunConfig,
    dataset: Dataset | None = None,
    model: Any = None,
    tokenizer: Any = None,
    embed: Any = None,
    judge: Any = None,
) -> Any:
    """Return a TRL ``GRPOTrainer`` wired to :class:`EpisodeRunner` (objects may be passed in, e.g. in tests)."""
    import os

    from datasets import Dataset as HFDataset
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if cfg.grammar and importlib.util.find_spec("xgrammar") is None:
        raise ConfigurationError("--grammar true needs xgrammar: pip install xgrammar")
    if dataset is None:
        if not cfg.data:
            raise ConfigurationError(f"no training data: pass --data (a {cfg.data_format} file or folder)")
        from dualmem.datasets import load_dataset

        dataset = load_dataset(cfg.data_format, cfg.data)
    if model is None or tokenizer is None:
        from dualmem.training.sft import SFTRunConfig, load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(
            SFTRunConfig(
                model_name_or_path=cfg.model_name_or_path,
                tokenizer_gguf_file=cfg.tokenizer_gguf_file,
                use_lora=cfg.use_lora,
            )
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    adapter = hasattr(
        model, "peft_config"
    )  # a peft model (local:ADAPTER with --use_lora): its own adapter goes on training
    if cfg.beta > 0 and not adapter and not Path(getattr(model.config, "_name_or_path", "") or "/nonexistent").is_dir():
        # TRL builds the KL reference model from the policy's path: give an in-memory model one
        init = Path(cfg.output_dir) / "initial_policy"
        model.save_pretrained(init)
        model.config._name_or_path = str(init)
    runner = EpisodeRunner(training_episodes(dataset, cfg, tokenizer), cfg, embed=embed, judge=judge)
    rows = cfg.episodes_per_step * cfg.num_generations  # one generation batch (played at once) and one optimizer step
    args = GRPOConfig(  # trained one sequence per micro-step: a padded batch makes CPU attention materialise (B, H, L, L) weights
        **cfg.trainer_args(),
        beta=cfg.beta,
        num_generations=cfg.num_generations,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=rows,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        shuffle_dataset=False,
        disable_dropout=True,
        reward_weights=[1.0, 0.0, 0.0],
        loss_type="grpo",
        gradient_checkpointing=False,
    )
    peft_config = None
    if cfg.use_lora and not adapter:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[episode_reward_func, fact_recall, insight_recall],  # type: ignore[list-item]
        args=args,
        train_dataset=HFDataset.from_list(runner.rows()),
        processing_class=tokenizer,
        rollout_func=runner,
        peft_config=peft_config,
    )
    trainer.dualmem_runner = runner  # type: ignore[attr-defined]
    return trainer


def train_grpo(cfg: GRPORunConfig, **objects: Any) -> dict[str, Any]:
    """Run GRPO, save the policy, and return (and write to ``dualmem_grpo_log.json``) the log, rollouts and step times."""
    from transformers import TrainerCallback

    trainer = build_trainer(cfg, **objects)
    steps: list[dict[str, float]] = []
    clock = time.time(), time.process_time()

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.append(
                {
                    "step": state.global_step,
                    "wall_s": round(time.time() - clock[0], 2),
                    "cpu_s": round(time.process_time() - clock[1], 2),
                }
            )

    trainer.add_callback(Clock())
    trainer.train()
    trainer.save_model(cfg.output_dir)
    Path(cfg.output_dir, "dualmem_grpo_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    out = {"log_history": trainer.state.log_history, "rollouts": trainer.dualmem_runner.history, "steps": steps}
    Path(cfg.output_dir, "dualmem_grpo_log.json").write_text(json.dumps(out, indent=1))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run TRL GRPO from command-line flags (every ``GRPORunConfig`` field is a ``--flag``)."""
    from dualmem.training.flags import parse_flags

    cfg = parse_flags(GRPORunConfig, argv, prog="python -m dualmem.training.grpo_trl")
    return train_grpo(cfg)


if __name__ == "__main__":
    main()
