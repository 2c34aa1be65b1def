"""TRL GRPO smoke: two steps on a tiny random Llama over one short writing episode, rewards logged."""

from __future__ import annotations

import json

import trl  # noqa: F401 - the [train] extra, installed by `make dev`; missing fails the suite
from fixtures.tiny_model import tiny_llama, tiny_tokenizer
from fixtures.train_data import make_item

from dualmem.schema import Dataset
from dualmem.testing import HashEmbeddings
from dualmem.training.episode import build_episode, gold_steps
from dualmem.training.grpo_trl import EpisodeRunner, GRPORunConfig, train_grpo
from dualmem.training.writing import writer_context

CTX = writer_context(embedder=HashEmbeddings(64))


def _short_item():
    item = make_item(sessions=2)
    item.queries = item.queries[:1]
    item.queries[0].gold.facts = item.queries[0].gold.facts[:1]
    item.queries[0].gold.turn_ids = item.queries[0].gold.turn_ids[:1]
    return item


def test_grpo_two_steps_logs_rewards(tmp_path):
    item = _short_item()
    ep = build_episode(item, chunk_tokens=400)
    steps = gold_steps(ep, CTX)
    texts = [m["content"] for s in steps for m in s.messages] + [s.target.model_dump_json() for s in steps]
    tok = tiny_tokenizer(texts)
    model = tiny_llama(tok)
    cfg = GRPORunConfig(
        output_dir=str(tmp_path / "grpo"),
        num_generations=2,
        max_completion_length=8,
        chunk_tokens=400,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        disable_tqdm=True,
        embedder="hash:64",
        memory_embedder="hash:64",
        save_steps=1000,
    )
    out = train_grpo(cfg, dataset=Dataset(name="t", items=[item]), model=model, tokenizer=tok, embed=HashEmbeddings(64))
    logs = [h for h in out["log_history"] if "reward" in h]
    assert len(logs) == 2
    assert all("rewards/episode_reward_func/mean" in h and "rewards/fact_recall/mean" in h for h in logs)
    assert all(-1.0 <= h["reward"] <= 1.0 for h in logs)
    assert json.loads((tmp_path / "grpo" / "dualmem_grpo_config.json").read_text())["num_generations"] == 2


def test_tiny_tokenizer_round_trips_the_writers_json():
    from dualmem.schema import MemoryUpdate
    from dualmem.training.writing import parse_update

    tok = tiny_tokenizer(["The user works night shifts at a warehouse."])
    update = MemoryUpdate.model_validate(
        {"facts": [{"op": "ADD", "id": "N1", "text": "The user works night shifts, naïvely"}]}
    )
    for text in ('{"facts":[]}', update.model_dump_json(), '{"insights": [], "facts": []}\n'):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert parse_update(tok.decode(tok(update.model_dump_json())["input_ids"], skip_special_tokens=True)) == update


def test_reward_terms_are_configurable_from_the_run_config():
    cfg = GRPORunConfig(reward="unparseable_penalty=0.2, similarity_weight=0.1")
    rc = cfg.reward_config()
    assert rc.unparseable_penalty == 0.2 and rc.similarity_weight == 0.1 and rc.embedder == cfg.embedder
    import pytest

    from dualmem.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown reward term 'nope'"):
        GRPORunConfig(reward="nope=1").reward_config()


class _Trainer:
    num_generations = 2
    model = object()
    processing_class = None

    class accelerator:
        @staticmethod
        def unwrap_model(m):
            return m


def test_runner_credits_every_turn_with_its_rollouts_episode_reward():
    from dualmem.training.rollout import Trajectory

    item = _short_item()
    ep = build_episode(item, chunk_tokens=60)
    runner = EpisodeRunner(
        [ep], GRPORunConfig(num_generations=2, embedder="hash:64", memory_embedder="hash:64"), embed=HashEmbeddings(64)
    )
    plays = []

    def fake_play(episode, model, tokenizer, groups):
        plays.append(episode.id)
        start = len(plays) * 10
        return [
            Trajectory(
                ep.memory(CTX),
                prompt_ids=[[start + g, t] for t in range(len(episode.chunks))],
                completion_ids=[[10 * g + t] for t in range(len(episode.chunks))],
                reward={"score": 0.25 + g / 2, "fact_recall": float(g), "insight_recall": 0.0},
            )
            for g in range(groups)
        ]

    runner.play = fake_play
    rows = runner.rows()
    assert [json.loads(r["prompt"])["turn"] for r in rows] == list(range(len(ep.chunks)))
    assert len(rows) >= 3
    out = [runner([r["prompt"], r["prompt"]], _Trainer()) for r in rows]
    assert plays == [ep.id]  # the whole episode is played once and served turn by turn
    for t, o in enumerate(out):
        assert o["prompt_ids"] == [[10, t], [11, t]] and o["completion_ids"] == [[t], [10 + t]]
        assert o["episode_reward"] == [0.25, 0.75] and o["logprobs"] is None
    runner([rows[0]["prompt"]] * 2, _Trainer())
    assert plays == [ep.id, ep.id]  # a new pass over the episode plays it again
