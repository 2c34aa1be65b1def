"""Supervised fine-tuning of the writer with TRL's ``SFTTrainer`` (full or LoRA).

Defaults mirror the paper's SFT recipe: learning rate 1e-5, cosine schedule,
5 % warm-up, effective batch 32 (1 per device x 32 accumulation steps),
1,000 steps, cutoff 6,144 tokens. The data is what ``dualmem train export-sft``
writes (chat ``messages``); the loss is on the assistant's ``MemoryUpdate`` only
(records become TRL prompt/completion pairs).

Run as a script: ``python -m dualmem.training.sft --model_name_or_path Qwen/Qwen3-4B --train_file runs/sft/train.jsonl``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dualmem.errors import ConfigurationError
from dualmem.training.run_config import TrainerFields, help_field

logger = logging.getLogger(__name__)


@dataclass
class SFTRunConfig(TrainerFields):
    """Settings of one SFT run of the writer (paper defaults; the TRL run fields come from :class:`TrainerFields`)."""

    train_file: str = help_field("runs/sft/train.jsonl", "chat-format JSONL from `dualmem train export-sft`")
    eval_file: str = help_field("", "held-out JSONL (personas unseen in training); empty = no evaluation")
    lora_alpha: int = help_field(32, "LoRA alpha")
    lora_dropout: float = help_field(0.05, "LoRA dropout")
    lora_target_modules: list[str] = help_field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "modules LoRA adapts"
    )
    lr_scheduler_type: str = help_field("cosine", "learning-rate schedule (paper: cosine)")
    warmup_ratio: float = help_field(0.05, "share of steps used for linear warm-up (paper: 5%)")
    per_device_train_batch_size: int = help_field(1, "sequences per device per micro-step")
    gradient_accumulation_steps: int = help_field(
        32, "micro-steps per optimizer step; effective batch = this x batch x devices (paper: 32)"
    )
    max_length: int = help_field(6144, "cutoff length in tokens, prompt + target (paper: 6,144)")
    gradient_checkpointing: bool = help_field(False, "trade compute for memory on long sequences")

    def effective_batch(self, devices: int = 1) -> int:
        """Return the effective batch size on ``devices`` devices."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * devices


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Read chat-format JSONL records as TRL prompt/completion pairs (loss on the target only).

    A record's ``loss_scope`` (``"facts"``: RealMem gold has no insights) is kept on the pair; see :func:`tokenize_pairs`.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigurationError(f"SFT data {path} does not exist; run `dualmem train export-sft` first")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
                messages = record["messages"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ConfigurationError(
                    f"{path} line {n}: not an SFT record with `messages` ({exc}); re-run `dualmem train export-sft`"
                ) from None
            rows.append(
                {"prompt": messages[:-1], "completion": messages[-1:], "loss_scope": record.get("loss_scope") or "all"}
            )
    if not rows:
        raise ConfigurationError(f"SFT data {path} is empty; check the export report")
    return rows


def tokenize_pairs(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> list[dict[str, list[int]]]:
    """Return pre-tokenized rows (``input_ids``, ``labels``): the chat template's prompt, then the target.

    Labels are -100 on the prompt; with ``loss_scope == "facts"`` also on everything after the target's
    facts part (the insights and the end of turn), so a target without gold insights teaches none.
    """
    from dualmem.training.realmem_gold import facts_prefix

    out, long = [], 0
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        if not full.startswith(prompt):
            raise ConfigurationError(
                "the tokenizer's chat template renders the prompt differently inside the conversation; use loss_scope 'all'"
            )
        completion = full[len(prompt) :]
        content = row["completion"][-1]["content"]
        start = completion.find(content)
        cut = start + facts_prefix(content) if row["loss_scope"] == "facts" and start >= 0 else len(completion)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
        labels = [
            tid if end <= cut else -100 for tid, (_, end) in zip(c["input_ids"], c["offset_mapping"], strict=True)
        ]
        if len(p_ids) + len(labels) > max_length:  # cutting would drop the target: the record is left out
            long += 1
            continue
        out.append({"input_ids": p_ids + c["input_ids"], "labels": [-100] * len(p_ids) + labels})
    if long:
        logger.warning(
            "%d of %d SFT records are longer than max_length %d and were left out", long, len(rows), max_length
        )
    if not out:
        raise ConfigurationError(f"every SFT record is longer than --max_length {max_length}; raise it")
    return out


def load_model_and_tokenizer(cfg: SFTRunConfig) -> tuple[Any, Any]:
    """Load the causal LM and its tokenizer named by ``cfg``.

    ``local:smollm2`` is the bundled model; ``local:smollm2-writer`` or ``local:FOLDER`` a LoRA adapter of it, merged
    into the weights, or with ``use_lora`` a trainable peft model whose own adapter goes on training (the saved output
    folder is then again a ``local:FOLDER`` model).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not cfg.model_name_or_path:
        raise ConfigurationError("no model: pass --model_name_or_path (a hub id, a local folder or local:smollm2)")
    if cfg.model_name_or_path.startswith(
        "local:"
    ):  # the bundled model (de-quantised from its GGUF, no hub) or a LoRA adapter of it
        from dualmem.models.local.bundled import adapter_dir, check_name, load_local

        name = cfg.model_name_or_path.removeprefix("local:")
        try:
            check_name(name)
        except ConfigurationError as exc:
            raise ConfigurationError(f"--model_name_or_path {cfg.model_name_or_path}: {exc}") from None
        adapter = adapter_dir(name) is not None
        model, tokenizer = load_local(
            name, merge=not (adapter and cfg.use_lora)
        )  # --use_lora trains the adapter itself further
        if (
            adapter and not cfg.use_lora
        ):  # merged: a KL reference must be built from these weights, not from the base's folder
            model.config._name_or_path = cfg.model_name_or_path
        return model, tokenizer
    kw = {"gguf_file": cfg.tokenizer_gguf_file} if cfg.tokenizer_gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_name_or_path, **kw)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_name_or_path, **kw)
    return model, tokenizer


def build_trainer(
    cfg: SFTRunConfig, model: Any = None, tokenizer: Any = None, callbacks: list[Any] | None = None
) -> Any:
    """Return a ready TRL ``SFTTrainer`` (model/tokenizer objects may be passed in, e.g. in tests)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    if model is None or tokenizer is None:
        model, tokenizer = load_model_and_tokenizer(cfg)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    peft_config = None
    if cfg.use_lora and not hasattr(
        model, "peft_config"
    ):  # a peft model (local:ADAPTER) goes on training its own adapter
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules,
            task_type="CAUSAL_LM",
        )
    args = SFTConfig(
        **cfg.trainer_args(),
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_ratio,  # a float < 1 is a ratio of max_steps in transformers 5
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        max_length=cfg.max_length,
        gradient_checkpointing=cfg.gradient_checkpointing,
        eval_strategy="steps" if cfg.eval_file else "no",
        eval_steps=cfg.save_steps if cfg.eval_file else None,
        completion_only_loss=True,
    )
    train_rows = read_records(cfg.train_file)
    eval_rows = read_records(cfg.eval_file) if cfg.eval_file else []
    if any(r["loss_scope"] != "all" for r in train_rows + eval_rows):  # a partial loss: tokenized here, labels set
        train = Dataset.from_list(tokenize_pairs(train_rows, tokenizer, cfg.max_length))
        evals = Dataset.from_list(tokenize_pairs(eval_rows, tokenizer, cfg.max_length)) if eval_rows else None
    else:
        train = Dataset.from_list([{k: r[k] for k in ("prompt", "completion")} for r in train_rows])
        evals = (
            Dataset.from_list([{k: r[k] for k in ("prompt", "completion")} for r in eval_rows]) if eval_rows else None
        )
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evals,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )


def train_sft(cfg: SFTRunConfig, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Train, save the model and tokenizer to ``cfg.output_dir``, and return the run's log history."""
    trainer = build_trainer(cfg, model, tokenizer)
    result = trainer.train()
    trainer.save_model(cfg.output_dir)
    Path(cfg.output_dir, "dualmem_sft_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    return {"train_loss": result.training_loss, "log_history": trainer.state.log_history}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run SFT from command-line flags (every ``SFTRunConfig`` field is a ``--flag``)."""
    from dualmem.training.flags import parse_flags

    cfg = parse_flags(SFTRunConfig, argv, prog="python -m dualmem.training.sft")
    return train_sft(cfg)


if __name__ == "__main__":
    main()
