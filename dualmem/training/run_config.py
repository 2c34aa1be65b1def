"""The fields the writer's training configs share: one help-field helper, the TRL run fields, the judge fields.

Every field carries its flag's help text (``metadata["help"]``); each run's
config (:class:`~dualmem.training.sft.SFTRunConfig`,
:class:`GRPORunConfig` (TRL GRPO, run by :mod:`dualmem.training.grpo_trl`),
:class:`~dualmem.training.verl.config.VerlRunConfig`) adds its own fields and
re-declares a shared one only where its default differs.

>>> TrainerFields(max_steps=3).trainer_args()["max_steps"]
3
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dualmem.config import setting_default
from dualmem.errors import ConfigurationError

FORMATS = ("rolememo", "realmem")


def help_field(default: Any, help: str) -> Any:
    """Return a dataclass field with ``help`` (its flag's text); a list default is copied for each instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class JudgeFields:
    """How the writer's reward is judged: the persona judge's weight and model, the recall protocol's embedder."""

    judge_weight: float = help_field(0.0, "weight of the persona judge in the reward (needs judge_model)")
    judge_model: str = help_field("", "judge as provider:model (any OpenAI-compatible endpoint via OPENAI_BASE_URL)")
    embedder: str = help_field(setting_default("embedder"), "embedder of the recall protocol (hash:64 in tests)")


TRAINER_ARGS = (
    "output_dir",
    "learning_rate",
    "max_steps",
    "logging_steps",
    "save_steps",
    "seed",
    "report_to",
    "use_cpu",
    "disable_tqdm",
    "bf16",
)


@dataclass
class TrainerFields:
    """Fields of a TRL run of the writer (SFT, GRPO); defaults are SFT's, GRPO re-declares those it changes."""

    model_name_or_path: str = help_field(
        "",
        "any Hugging Face causal LM: hub id (needs network), local folder, local:smollm2 (the bundled model), "
        "local:smollm2-writer or local:FOLDER (a LoRA adapter of it)",
    )
    tokenizer_gguf_file: str = help_field("", "load the tokenizer from this GGUF file inside model_name_or_path")
    output_dir: str = help_field("runs/sft/model", "where checkpoints and the final model are written")
    learning_rate: float = help_field(1e-5, "peak learning rate (paper: 1e-5 for SFT, 1e-6 for GRPO)")
    use_lora: bool = help_field(False, "train LoRA adapters (peft) instead of all weights")
    lora_r: int = help_field(16, "LoRA rank")
    max_steps: int = help_field(1000, "optimizer steps (paper: 1,000 for SFT)")
    logging_steps: int = help_field(10, "log every N optimizer steps")
    save_steps: int = help_field(200, "save a checkpoint every N steps")
    seed: int = help_field(42, "random seed")
    report_to: str = help_field("none", "tracker: none, wandb, tensorboard")
    use_cpu: bool = help_field(False, "force CPU (tests)")
    disable_tqdm: bool = help_field(False, "hide the progress bar")
    bf16: bool = help_field(
        False, "train in bfloat16 autocast (GPUs that support it; CPUs with AVX512-BF16 or AMX too)"
    )

    def trainer_args(self) -> dict[str, Any]:
        """Return the TRL trainer arguments these fields set (``TRAINER_ARGS``)."""
        return {name: getattr(self, name) for name in TRAINER_ARGS}


@dataclass
class GRPORunConfig(TrainerFields, JudgeFields):
    """Settings of one TRL GRPO run of the writer (shared fields: :class:`TrainerFields`, :class:`JudgeFields`)."""

    model_name_or_path: str = help_field("", "policy: a Hugging Face causal LM (usually the SFT output)")
    data: str = help_field("", "training data: a file or folder of --data_format (dualmem.datasets.load_dataset)")
    data_format: str = help_field(
        "rolememo", "rolememo (gold facts and insights of queries) or realmem (memory points as gold facts)"
    )
    episode_chunks: int = help_field(
        0, "realmem: chunks per episode, windows that hold memory points (0: the whole history)"
    )
    max_chunks: int = help_field(0, "realmem: only the first N chunks of each history (0: all)")
    skip_chunks: int = help_field(
        0,
        "realmem: episodes start at chunk N or later (e.g. past the chunks SFT trained on); the gold before them is their memory",
    )
    max_prompt_tokens: int = help_field(
        0, "realmem: leave out episodes whose prompts (from the starting memory) are longer (0: keep all)"
    )
    grammar: bool = help_field(
        False, "sample rollouts under the writer's JSON grammar (xgrammar), as the bundled model writes"
    )
    output_dir: str = help_field("runs/grpo/model", "where checkpoints and the final model are written")
    num_generations: int = help_field(8, "rollouts per group (paper: n = 8)")
    episodes_per_step: int = help_field(1, "groups per optimizer step (rows per device batch = this x num_generations)")
    learning_rate: float = help_field(1e-6, "learning rate (paper: 1e-6)")
    beta: float = help_field(0.001, "KL coefficient against the reference model (paper: 0.001)")
    max_completion_length: int = help_field(1024, "max tokens of one MemoryUpdate (paper: 1,024)")
    chunk_tokens: int = help_field(4000, "history chunk size in tokens (paper: 4,000)")
    view_k: int = help_field(
        setting_default("view_k"), "relevant facts/insights shown in the working view (the writer's view_k setting)"
    )
    view_recent: int = help_field(
        setting_default("view_recent"), "newest facts/insights always shown (the writer's view_recent setting)"
    )
    memory_embedder: str = help_field(
        "",
        "embedder of each rollout's memory store (its working view's search, dedup); empty: the embedder setting's, as the product writes",
    )
    temperature: float = help_field(1.0, "sampling temperature of rollouts")
    max_steps: int = help_field(200, "optimizer steps")
    logging_steps: int = help_field(1, "log every N steps")
    save_steps: int = help_field(50, "save every N steps")
    reward: str = help_field(
        "", "reward terms as NAME=VALUE,... (RewardConfig: unparseable_penalty, similarity_weight, format_weight, ...)"
    )

    def __post_init__(self) -> None:
        if self.data_format not in FORMATS:
            raise ConfigurationError(f"--data_format {self.data_format!r}: use one of {', '.join(FORMATS)}")
        limits = {
            "episode_chunks": self.episode_chunks,
            "max_chunks": self.max_chunks,
            "skip_chunks": self.skip_chunks,
            "max_prompt_tokens": self.max_prompt_tokens,
        }
        for name, value in limits.items():
            if value < 0:
                raise ConfigurationError(f"--{name} {value}: a count, 0 or more (0: no limit)")
        if self.data_format != "realmem" and any(limits.values()):
            raise ConfigurationError(f"--{', --'.join(limits)} cut RealMem histories: pass --data_format realmem")

    def writer_context(self) -> Any:
        """Return the writer's context of this run's episodes (the settings with this run's view, chunk size and memory embedder)."""
        from dualmem.training.writing import writer_context

        return writer_context(
            embedder=self.memory_embedder,
            view_k=self.view_k,
            view_recent=self.view_recent,
            chunk_tokens=self.chunk_tokens,
        )

    def reward_config(self) -> Any:
        """Return the reward settings of this run (``reward`` overrides any RewardConfig field)."""
        from dualmem.training.rewards import RewardConfig

        names = {f.name: f for f in fields(RewardConfig)}
        extra: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in self.reward.split(","))):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or name not in names:
                raise ConfigurationError(
                    f"--reward {part!r}: unknown reward term {name!r}; use NAME=VALUE with one of {', '.join(names)}"
                )
            default: Any = names[name].default
            extra[name] = type(default)(value.strip())
        return RewardConfig(
            **{"judge_weight": self.judge_weight, "judge_model": self.judge_model, "embedder": self.embedder, **extra}
        )
