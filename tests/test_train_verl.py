"""VeRL pieces through VeRL's own loaders: Hydra config, reward function, agent loop, RLHFDataset.

Needs ``verl==0.9.1``: marked ``verl``, run by ``make test-verl`` in the ``.venv-verl`` venv (docs/training.md)
and deselected from the main venv's run; where it is selected, a missing VeRL fails.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fixtures.tiny_model import tiny_tokenizer
from fixtures.train_data import make_dataset

from dualmem.training.rewards import RewardConfig
from dualmem.training.verl.config import AGENT_NAME, VerlRunConfig, compose, validate, write_launch
from dualmem.training.verl.dataset import load_episodes, write_verl_dataset

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True, scope="module")
def _verl_installed():
    """Selected with ``-m verl``, these tests need VeRL: a missing install fails them, never skips."""
    import verl  # noqa: F401


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl")
    counts = write_verl_dataset(make_dataset(3), out, chunk_tokens=200, val_ratio=0.34, memory_embedder="hash:64")
    assert counts["train"] > 0 and counts["val"] > 0
    return out


@pytest.fixture(scope="module")
def config(data_dir):
    cfg = VerlRunConfig(model_path=str(data_dir / "model"), data_dir=str(data_dir), embedder="hash:64")
    return compose(cfg)


def test_config_composes_with_verls_hydra_config_and_validates(config):
    assert config.algorithm.adv_estimator == "grpo"
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (rollout.n, config.data.train_batch_size, actor.ppo_mini_batch_size, actor.optim.lr) == (8, 16, 4, 1e-6)
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert (config.data.max_response_length, rollout.name, rollout.agent.default_agent_loop) == (
        1024,
        "vllm",
        AGENT_NAME,
    )
    validate(config)


def test_invalid_batch_is_rejected_by_verl(data_dir):
    bad = compose(VerlRunConfig(model_path="m", data_dir=str(data_dir), train_batch_size=3, ppo_mini_batch_size=4))
    with pytest.raises((AssertionError, ValueError)):
        validate(bad)


def test_launch_yaml_documents_every_setting(tmp_path, data_dir):
    cfg = VerlRunConfig(model_path="m", data_dir=str(data_dir), output_dir=str(tmp_path))
    text = write_launch(cfg).read_text()
    assert "actor_rollout_ref.rollout.n=8" in text and "kl_loss_coef = 0.001" in text and "chunk_tokens = 4000" in text


def test_reward_loads_through_verls_loader(config, data_dir):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(config)
    episode = next(iter(load_episodes(data_dir / "episodes.jsonl").values()))
    gt = episode.ground_truth()
    good = json.dumps(
        {"facts": [{"op": "ADD", "id": f"N{i}", "text": t} for i, t in enumerate(gt["facts"], 1)], "insights": []}
    )
    high = fn(data_source="dualmem", solution_str=good, ground_truth=json.dumps(gt), extra_info={})
    low = fn(data_source="dualmem", solution_str="{}", ground_truth=json.dumps(gt), extra_info={})
    # "{}" parses (an empty MemoryUpdate): no recall, only the share-of-turns-parsed credit
    assert high["fact_recall"] == 1.0 and high["score"] > low["score"] == pytest.approx(RewardConfig().format_weight)
    assert low["fact_recall"] == 0.0 and low["parsed_share"] == 1.0


def test_dataset_loads_with_verls_rlhf_dataset(config, data_dir):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    texts = [
        c["text"] for line in (data_dir / "episodes.jsonl").read_text().splitlines() for c in json.loads(line)["chunks"]
    ]
    tok = tiny_tokenizer(texts + ["dualmem writer episode turn"])
    ds = RLHFDataset(data_files=[str(data_dir / "train.parquet")], tokenizer=tok, config=config.data)
    row = ds[0]
    assert row["extra_info"]["turn"] == 0 and row["agent_name"] == AGENT_NAME
    import pyarrow.parquet as pq

    assert len(ds) == pq.read_table(data_dir / "train.parquet").num_rows > 0


class _Server:
    """A rollout server stand-in returning a fixed MemoryUpdate for every chunk."""

    def __init__(self, tok, text):
        self.ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        self.calls = 0

    async def generate(self, request_id, prompt_ids, sampling_params, **kw):
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        return TokenOutput(token_ids=self.ids, log_probs=[-0.5] * len(self.ids))


def test_agent_loop_loads_through_verl_and_credits_every_turn(config, data_dir):
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )

    from dualmem.training.verl import agent_loop as module

    (entry,) = OmegaConf.load(data_dir / "agent_loop.yaml")
    assert entry.name == AGENT_NAME and AGENT_NAME in _agent_loop_registry
    episodes = load_episodes(data_dir / "episodes.jsonl")
    texts = [c["text"] for e in episodes.values() for c in e.chunks]
    tok = tiny_tokenizer(texts + ["facts insights op ADD id N1 text"])
    server = _Server(tok, "{ }")
    episode = next(iter(episodes.values()))
    turns = len(episode.chunks)

    async def play_all():  # VeRL instantiates agent loops inside its running event loop
        loop = hydra.utils.instantiate(
            entry,
            trainer_config=DictConfigWrap(config),
            server_manager=server,
            tokenizer=tok,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
            _convert_="none",
        )
        assert isinstance(loop, AgentLoopBase) and isinstance(loop, module.DualMemWriterAgentLoop)
        outs = []
        for turn in range(turns):
            info = {"episode_id": episode.id, "turn": turn}
            outs.append(
                await asyncio.gather(
                    *[loop.run({"temperature": 1.0}, extra_info=info, raw_prompt=[]) for _ in range(2)]
                )
            )
        return outs

    outs = asyncio.run(play_all())
    assert server.calls == 2 * turns  # two trajectories, each chunk generated once
    for pair in outs:
        for out in pair:
            assert out.response_mask == [1] * len(out.response_ids) and out.reward_score is not None
            assert out.extra_fields["reward_extra_info"]["score"] == out.reward_score
    # "{}" is an empty MemoryUpdate: nothing recalled, every turn parsed (the format credit only), on every turn
    assert {round(o.reward_score, 6) for pair in outs for o in pair} == {RewardConfig().format_weight}
    assert not module.POOL.entries.get(episode.id)  # fully served trajectories are dropped


def test_agent_loop_yaml_entry_survives_the_modules_import(data_dir, config):
    """VeRL's worker registers agent_loop.yaml's entry, then builds loops from the registry (importing the module
    on the first build): the entry with episodes_path must still be there for the second loop."""
    import importlib

    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    from dualmem.training.verl import agent_loop as module

    (entry,) = OmegaConf.load(data_dir / "agent_loop.yaml")
    _agent_loop_registry[entry.name] = entry  # as AgentLoopWorker.__init__ does
    importlib.reload(module)  # the first build imports the module
    tok = tiny_tokenizer(["facts insights"])
    for _ in range(2):
        loop = hydra.utils.instantiate(
            _agent_loop_registry[AGENT_NAME],
            trainer_config=DictConfigWrap(config),
            server_manager=None,
            tokenizer=tok,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )
        assert loop.episodes_path == str(data_dir / "episodes.jsonl")


def test_the_launch_yamls_run_command_works_as_written(tmp_path, data_dir):
    """The header's command, run by a shell as written (plus Hydra's --cfg job: print the config, start nothing)."""
    import subprocess

    cfg = VerlRunConfig(model_path=str(tmp_path / "model"), data_dir=str(data_dir), output_dir=str(tmp_path / "out"))
    header = write_launch(cfg).read_text().splitlines()[1]
    assert header.startswith("# Run: ")
    done = subprocess.run(
        header.removeprefix("# Run: ") + " --cfg job",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compute_score" in done.stdout and str(data_dir) in done.stdout


def test_the_launch_site_hides_a_trl_without_the_value_head(tmp_path):
    """VeRL patches TRL's AutoModelForCausalLMWithValueHead when trl imports; a TRL without it is hidden in VeRL runs."""
    import subprocess
    import sys

    from dualmem.training.verl.config import SITE, launch_env

    new = tmp_path / "new" / "trl"
    new.mkdir(parents=True)
    (new / "__init__.py").write_text("__version__ = '1.0'\n")
    old = tmp_path / "old" / "trl"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text("class AutoModelForCausalLMWithValueHead: ...\n")
    probe = "from verl.utils.import_utils import is_trl_available; print(is_trl_available())"
    for folder, expected in ((new.parent, "False"), (old.parent, "True")):
        env = launch_env({"PYTHONPATH": str(folder)})
        assert env["PYTHONPATH"].startswith(str(SITE))
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr[-1000:]
