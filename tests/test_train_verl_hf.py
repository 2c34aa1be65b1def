"""The transformers rollout backend (``rollout.name=hf``) through VeRL's own registry, replica, client and load balancer.

Needs ``verl==0.9.1`` and Ray: marked ``verl`` (``make test-verl``, the ``.venv-verl`` venv). The model is a tiny
random Llama on the CPU; what a GPU adds (the trainer's FSDP weights) was run on a lent H100 (docs/training.md).
"""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
from fixtures.tiny_model import tiny_llama, tiny_tokenizer
from fixtures.train_data import make_dataset

from dualmem.training.verl.config import (
    HF_MODULE,
    VerlRunConfig,
    compose,
    launch_env,
    overrides,
    validate,
    write_launch,
)
from dualmem.training.verl.dataset import load_episodes, write_verl_dataset

pytestmark = pytest.mark.verl
RESPONSE = 12


@pytest.fixture(autouse=True, scope="module")
def _verl_installed():
    import verl  # noqa: F401


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl-hf")
    write_verl_dataset(make_dataset(2), out, chunk_tokens=200, val_ratio=0.5, memory_embedder="hash:64")
    texts = [c["text"] for e in load_episodes(out / "episodes.jsonl").values() for c in e.chunks]
    tok = tiny_tokenizer(texts)
    for name, seed in (("model", 0), ("other", 1)):
        tiny_llama(tok, seed=seed).save_pretrained(out / name)
        tok.save_pretrained(out / name)
    return out


@pytest.fixture(scope="module")
def config(data_dir):
    cfg = VerlRunConfig(
        model_path=str(data_dir / "model"),
        data_dir=str(data_dir),
        embedder="hash:64",
        rollout_engine="hf",
        max_response_length=RESPONSE,
    )
    return compose(cfg)


def _model_config(path):
    return SimpleNamespace(path=str(path), local_path=str(path), trust_remote_code=False)


def _greedy(path, prompt, n=RESPONSE):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=model.config.pad_token_id,
            eos_token_id=model.config.eos_token_id,
        )
    row = out[0, len(prompt) :].tolist()
    eos = model.config.eos_token_id
    return row[: row.index(eos) + 1] if eos in row else row


def _prompts(data_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(data_dir / "model")
    texts = [
        "The user works night shifts at the harbour.",
        "I keep a diary",
        "Tell me about the ferry schedule and the tides, please.",
    ]
    return [tok(t)["input_ids"] for t in texts]


def test_hf_is_registered_with_verl_and_composes(config):
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from dualmem.training.verl import hf_rollout

    assert config.actor_rollout_ref.rollout.name == "hf"
    validate(config)
    assert get_rollout_class("hf", "async") is hf_rollout.HFServerAdapter
    assert get_rollout_replica_class("hf") is hf_rollout.HFReplica


def test_launch_env_and_yaml_load_the_backend_in_every_process(tmp_path, data_dir):
    env = launch_env({"VERL_USE_EXTERNAL_MODULES": "x.plugin"}, rollout_engine="hf")
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"x.plugin,{HF_MODULE}"
    assert "VERL_USE_EXTERNAL_MODULES" not in launch_env({}, rollout_engine="vllm")
    cfg = VerlRunConfig(model_path="m", data_dir=str(data_dir), output_dir=str(tmp_path), rollout_engine="hf")
    assert f"VERL_USE_EXTERNAL_MODULES={HF_MODULE} " in write_launch(cfg).read_text().splitlines()[1]
    with pytest.raises(Exception, match="rollout_engine 'hff'"):
        overrides(VerlRunConfig(model_path="m", rollout_engine="hff"))


def test_server_batches_concurrent_requests_like_single_greedy_runs(config, data_dir):
    """Left-padded batched generation gives each prompt the tokens it gets alone; log-probs are the model's."""
    import torch
    from transformers import AutoModelForCausalLM

    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    prompts = _prompts(data_dir)
    batches = []
    original = server._generate_batch
    server._generate_batch = lambda p, k: batches.append(len(p)) or original(p, k)
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def ask():
        return await asyncio.gather(
            *[server.generate(prompt_ids=p, sampling_params=greedy, request_id=str(i)) for i, p in enumerate(prompts)]
        )

    outs = asyncio.run(ask())
    assert batches == [len(prompts)]  # one generate call for the three concurrent requests
    model = AutoModelForCausalLM.from_pretrained(data_dir / "model").eval()
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == _greedy(data_dir / "model", prompt)
        assert out.stop_reason == ("completed" if out.token_ids[-1] == model.config.eos_token_id else "length")
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0].log_softmax(-1)
        expected = [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(out.token_ids)]
        assert out.log_probs == pytest.approx(expected, abs=1e-4)


def _logprobs(path, prompt, response, temperature=1.0):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = (model(torch.tensor([prompt + response])).logits[0] / temperature).log_softmax(-1)
    return [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(response)]


def test_log_probs_follow_verls_logprobs_mode(config, data_dir):
    """processed_logprobs (VeRL's default): the distribution sampled from, temperature applied; raw_logprobs: the model's."""
    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    assert not server.raw_logprobs
    prompt = _prompts(data_dir)[0]
    hot = {"temperature": 2.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    out = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=hot))
    assert out.log_probs == pytest.approx(
        _logprobs(data_dir / "model", prompt, out.token_ids, temperature=2.0), abs=1e-4
    )
    server.raw_logprobs = True
    out = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=hot))
    assert out.log_probs == pytest.approx(_logprobs(data_dir / "model", prompt, out.token_ids), abs=1e-4)


def test_eos_ends_a_response_and_failures_reach_every_waiting_request(config, data_dir):
    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    prompts = _prompts(data_dir)
    greedy = {"temperature": 0.0}
    first = asyncio.run(server.generate(prompt_ids=prompts[0], sampling_params=greedy))
    assert first.stop_reason == "length" and len(first.token_ids) == RESPONSE  # the random model never says EOS
    server.eos_ids = [first.token_ids[0]]  # now its first token is EOS: the response ends there, EOS included
    done = asyncio.run(server.generate(prompt_ids=prompts[0], sampling_params=greedy))
    assert done.token_ids == first.token_ids[:1] and done.stop_reason == "completed"

    original, calls = server._generate_batch, []

    def flaky(p, k):
        calls.append(len(p))
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return original(p, k)

    server._generate_batch = flaky

    async def ask():
        return await asyncio.gather(
            *[server.generate(prompt_ids=p, sampling_params=greedy) for p in prompts], return_exceptions=True
        )

    failed = asyncio.run(ask())
    assert calls == [3] and all(isinstance(f, RuntimeError) and "simulated" in str(f) for f in failed)
    again = asyncio.run(ask())  # the server keeps serving
    assert calls == [3, 3] and not any(isinstance(o, Exception) for o in again)


def test_requests_of_other_lengths_are_batched_apart(config, data_dir):
    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    prompt = _prompts(data_dir)[0]
    sizes = []
    original = server._generate_batch
    server._generate_batch = lambda p, k: sizes.append((len(p), k[-1])) or original(p, k)

    async def ask():
        params = [{"temperature": 1.0, "max_tokens": 3}, {"temperature": 1.0}, {"temperature": 1.0, "max_tokens": 3}]
        return await asyncio.gather(*[server.generate(prompt_ids=prompt, sampling_params=p) for p in params])

    outs = asyncio.run(ask())
    assert sorted(sizes) == [(1, RESPONSE), (2, 3)]
    assert len(outs[0].token_ids) <= 3 and len(outs[2].token_ids) <= 3 and len(outs[1].token_ids) <= RESPONSE
    sizes.clear()
    server.max_batch = 2  # max_num_seqs: a larger queue is answered in several batches

    async def many():
        return await asyncio.gather(
            *[server.generate(prompt_ids=prompt, sampling_params={"temperature": 1.0}) for _ in range(5)]
        )

    assert len(asyncio.run(many())) == 5 and sizes == [(2, RESPONSE), (2, RESPONSE), (1, RESPONSE)]


def test_sleep_moves_the_model_only_with_free_cache_engine(config, data_dir):
    """VeRL wakes the rollout before a weight update only with free_cache_engine; without it, sleep must not move it."""
    import torch

    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    moves = []
    server.model.to = lambda device: moves.append(str(device))
    server.device = torch.device("cuda")  # as on a GPU (nothing touches CUDA below)
    server.free_cache_engine = False
    server.sleep()
    assert moves == []
    server.free_cache_engine = True
    server.sleep()
    server.wake_up(tags=["weights"])
    assert moves == ["cpu", "cuda"]


def test_the_adapter_refuses_what_the_server_cannot_load(config, data_dir, monkeypatch):
    from dualmem.training.verl.hf_rollout import HFServerAdapter

    monkeypatch.setitem(os.environ, "RANK", "0")
    adapter = HFServerAdapter(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"), device_mesh=None)
    with pytest.raises(NotImplementedError, match="checkpoint_engine.backend=naive"):
        asyncio.run(adapter.update_weights(iter([]), wire_format="delta_flush"))
    with pytest.raises(NotImplementedError, match="lora.merge=true"):
        asyncio.run(adapter.update_weights(iter([]), peft_config={"r": 8}))


def test_server_samples_and_honours_limits(config, data_dir):
    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    prompt = _prompts(data_dir)[0]

    async def ask(params, n=8):
        return await asyncio.gather(*[server.generate(prompt_ids=prompt, sampling_params=params) for _ in range(n)])

    sampled = asyncio.run(ask({"temperature": 1.5, "top_p": 1.0, "top_k": -1, "logprobs": False}))
    assert len({tuple(o.token_ids) for o in sampled}) > 1 and all(o.log_probs is None for o in sampled)
    short = asyncio.run(ask({"temperature": 1.5, "max_tokens": 3}, n=2))
    assert all(len(o.token_ids) <= 3 for o in short)
    server.max_model_len = len(prompt)  # no room left for a response
    (full,) = asyncio.run(ask({"temperature": 1.0}, n=1))
    assert full.token_ids == [] and full.stop_reason == "length"


def test_server_loads_the_trainers_weights_and_rejects_foreign_ones(config, data_dir):
    from transformers import AutoModelForCausalLM

    from dualmem.training.verl.hf_rollout import HFServer

    server = HFServer(config.actor_rollout_ref.rollout, _model_config(data_dir / "model"))
    prompt = _prompts(data_dir)[2]
    greedy = {"temperature": 0.0, "logprobs": True}
    before = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=greedy)).log_probs
    other = AutoModelForCausalLM.from_pretrained(data_dir / "other").state_dict()
    assert server.update_weights(other, global_steps=3) == len(other)
    after = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=greedy))
    assert after.token_ids == _greedy(data_dir / "other", prompt)
    assert after.log_probs != pytest.approx(before, abs=1e-3)  # the random models differ in what they are sure of
    assert after.extra_fields["global_steps"] == 3
    with pytest.raises(ValueError, match="weights the rollout model lacks"):
        server.update_weights({"model.layers.9.mlp.up_proj.weight": other["model.norm.weight"]})


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": HF_MODULE}},
    )
    yield ray
    ray.shutdown()


def test_replica_adapter_client_and_agent_loop_through_ray(ray_cluster, config, data_dir, monkeypatch):
    """VeRL's replica starts the server; the adapter pushes weights to it; VeRL's client and load balancer reach it;
    the writer's agent loop plays an episode through them."""
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import get_rollout_replica_class
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from dualmem.training.verl.hf_rollout import HFServerAdapter

    ray = ray_cluster
    rollout = config.actor_rollout_ref.rollout
    worker = ray.remote(type("Worker", (), {})).options(num_cpus=0).remote()
    replica = get_rollout_replica_class("hf")(
        replica_rank=0, config=rollout, model_config=_model_config(data_dir / "model"), gpus_per_node=1
    )
    asyncio.run(replica.init_hybrid(SimpleNamespace(workers=[worker])))
    prompt = _prompts(data_dir)[1]

    monkeypatch.setitem(os.environ, "RANK", "0")
    adapter = HFServerAdapter(rollout, _model_config(data_dir / "model"), device_mesh=None)
    other = AutoModelForCausalLM.from_pretrained(data_dir / "other").state_dict()

    async def sync_and_ask():
        await adapter.release()
        await adapter.resume(tags=["weights"])
        await adapter.update_weights(iter(other.items()), global_steps=1)
        lb = ray.remote(GlobalRequestLoadBalancer).remote({replica.server_address: replica.server_handle})
        client = LLMServerClient(config, load_balancer_handle=lb)
        out = await client.generate("r1", prompt_ids=prompt, sampling_params={"temperature": 0.0, "logprobs": True})
        tok = AutoTokenizer.from_pretrained(data_dir / "model")
        (entry,) = OmegaConf.load(data_dir / "agent_loop.yaml")
        loop = hydra.utils.instantiate(
            entry,
            trainer_config=DictConfigWrap(config),
            server_manager=client,
            tokenizer=tok,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
            _convert_="none",
        )
        episode = next(iter(load_episodes(data_dir / "episodes.jsonl").values()))
        played = await asyncio.gather(
            *[
                loop.run(
                    {"temperature": 1.0, "logprobs": True},
                    extra_info={"episode_id": episode.id, "turn": t},
                    raw_prompt=[],
                )
                for t in range(len(episode.chunks))
            ]
        )
        return out, played, await replica.server_handle.stats.remote()

    out, played, stats = asyncio.run(sync_and_ask())
    assert out.token_ids == _greedy(data_dir / "other", prompt) and out.extra_fields["global_steps"] == 1
    import torch

    model = AutoModelForCausalLM.from_pretrained(data_dir / "other").eval()
    with torch.no_grad():  # the server answers with the pushed weights, not the ones it loaded
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0].log_softmax(-1)
    assert out.log_probs == pytest.approx(
        [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(out.token_ids)], abs=1e-4
    )
    for turn in played:
        assert 0 < len(turn.response_ids) <= RESPONSE and len(turn.response_logprobs) == len(turn.response_ids)
        assert turn.reward_score is not None
    assert stats["generated_tokens"] >= sum(len(t.response_ids) for t in played) + len(out.token_ids)
