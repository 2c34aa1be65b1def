"""SFT smoke: a few TRL steps on a tiny random Llama, loss goes down on a repeated batch."""

from __future__ import annotations

import json

import pytest
import trl  # noqa: F401 - the [train] extra, installed by `make dev`; missing fails the suite
from fixtures.tiny_model import tiny_llama, tiny_tokenizer
from fixtures.train_data import make_dataset

from dualmem.testing import HashEmbeddings
from dualmem.training.export import export_sft
from dualmem.training.sft import SFTRunConfig, main, read_records, train_sft


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    export_sft(
        out, dataset=make_dataset(2), chunk_tokens=60, keep_empty=0.0, eval_ratio=0.5, embedder=HashEmbeddings(64)
    )
    return out


def test_defaults_mirror_the_paper():
    cfg = SFTRunConfig()
    assert (cfg.learning_rate, cfg.lr_scheduler_type, cfg.warmup_ratio) == (1e-5, "cosine", 0.05)
    assert (cfg.effective_batch(), cfg.max_steps, cfg.max_length) == (32, 1000, 6144)


def test_records_become_prompt_completion(sft_dir):
    rows = read_records(sft_dir / "train.jsonl")
    assert rows and all(r["completion"][0]["role"] == "assistant" for r in rows)
    assert all(json.loads(r["completion"][0]["content"]).keys() == {"facts", "insights"} for r in rows)


def test_sft_loss_decreases_on_repeated_batch(sft_dir, tmp_path):
    texts = [
        m["content"]
        for line in (sft_dir / "train.jsonl").read_text().splitlines()
        for m in json.loads(line)["messages"]
    ]
    tok = tiny_tokenizer(texts)
    model = tiny_llama(tok)
    cfg = SFTRunConfig(
        train_file=str(sft_dir / "train.jsonl"),
        output_dir=str(tmp_path / "m"),
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        warmup_ratio=0.0,
        gradient_accumulation_steps=1,
        per_device_train_batch_size=4,
        max_steps=12,
        max_length=1024,
        logging_steps=1,
        save_steps=1000,
        use_cpu=True,
        disable_tqdm=True,
    )
    out = train_sft(cfg, model=model, tokenizer=tok)
    losses = [h["loss"] for h in out["log_history"] if "loss" in h]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 * 0.85
    assert (tmp_path / "m" / "dualmem_sft_config.json").exists()


def test_main_explains_missing_model(tmp_path):
    from dualmem.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="model_name_or_path"):
        main(["--train_file", str(tmp_path / "x.jsonl")])
