"""The fields the writer's training configs share: one help-field helper, the TRL run fields, the judge fields.

Every field carries its flag's help text (``metadata["help"]``); each run's
config (:class:`~dualmem.training.sft.SFTRunConfig`,
:class:`~dualmem.training.grpo_trl.GRPORunConfig`,
:class:`~dualmem.training.verl.config.VerlRunConfig`) adds its own fields and
re-declares a shared one only where its default differs.

>>> TrainerFields(max_steps=3).trainer_args()["max_steps"]
3
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dualmem.config import setting_default


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


TRAINER_ARGS = ("output_dir", "learning_rate", "max_steps", "logging_steps", "save_steps", "seed", "report_to", "use_cpu", "disable_tqdm", "bf16")


@dataclass
class TrainerFields:
    """Fields of a TRL run of the writer (SFT, GRPO); defaults are SFT's, GRPO re-declares those it changes."""

    model_name_or_path: str = help_field("", "any Hugging Face causal LM: hub id (needs network), local folder, local:smollm2 (the bundled model), local:smollm2-writer or local:FOLDER (a LoRA adapter of it)")
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
    bf16: bool = help_field(False, "train in bfloat16 autocast (GPUs that support it; CPUs with AVX512-BF16 or AMX too)")

    def trainer_args(self) -> dict[str, Any]:
        """Return the TRL trainer arguments these fields set (``TRAINER_ARGS``)."""
        return {name: getattr(self, name) for name in TRAINER_ARGS}
