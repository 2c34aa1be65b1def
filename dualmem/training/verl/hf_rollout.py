"""A transformers rollout backend for VeRL 0.9 (``actor_rollout_ref.rollout.name=hf``).

VeRL 0.9 generates only through rollout *servers* (vLLM, SGLang, TensorRT-LLM): the agent loop sends token ids
to a server actor and gets token ids back; the trainer pushes its weights to the server after every update. Those
engines are large (vLLM 0.24's wheel alone is 266 MiB) and pin their own torch. This backend is the same contract
served by ``transformers`` ``generate`` on the GPU the trainer uses: slower per token than vLLM, but with nothing
to install beyond what VeRL already needs, and exact for small writers (SmolLM2-135M, the tiny test models).

Three parts, as for vLLM:

- :class:`HFServer` — a Ray actor holding the model; ``generate`` batches concurrent requests (left-padded, one
  ``generate`` call per group of equal sampling parameters) and returns VeRL's ``TokenOutput`` with the sampled
  tokens' log-probs; ``update_weights`` loads the trainer's weights; ``sleep``/``wake_up`` move the model off and
  back onto the GPU around the training phase.
- :class:`HFServerAdapter` — VeRL's ``BaseRollout`` inside each trainer worker: streams the actor's full weights to
  the server (every rank walks the generator, since gathering a sharded tensor is collective; rank 0 sends).
- :class:`HFReplica` — VeRL's ``RolloutReplica``: starts one server per replica on its workers' node and GPU.

Importing this module registers ``hf`` with VeRL (``VERL_USE_EXTERNAL_MODULES=dualmem.training.verl.hf_rollout``,
which :func:`dualmem.training.verl.config.launch_env` sets when ``rollout_engine`` is ``hf``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

logger = logging.getLogger(__name__)
NAME = "hf"
BATCH_WINDOW_S = 0.005  # how long the server waits for more requests before a batched generate


def server_name(replica_rank: int, node_rank: int = 0, suffix: str = "") -> str:
    """Return the Ray actor name of a replica's server (the adapter finds it by this name)."""
    return f"{NAME}_server_{replica_rank}_{node_rank}{suffix}"


def _sampling_key(params: dict[str, Any]) -> tuple[float, float, int, float, bool]:
    """Return the generate arguments a request's sampling parameters map to (requests with equal keys share a batch)."""
    top_k = int(params.get("top_k", -1) or -1)
    return (
        float(params.get("temperature", 1.0)),
        float(params.get("top_p", 1.0)),
        top_k if top_k > 0 else 0,  # vLLM's -1 = no top-k; transformers: 0
        float(params.get("repetition_penalty", 1.0)),
        bool(params.get("logprobs", False)),
    )


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    future: asyncio.Future = field(repr=False)


class HFServer:
    """Ray actor: one transformers model on one GPU (or the CPU), serving VeRL's token-in-token-out ``generate``."""

    def __init__(self, config: Any, model_config: Any, cuda_visible_devices: str | None = None, **_: Any) -> None:
        if cuda_visible_devices:  # before CUDA is initialised in this process (Ray was told not to set it)
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        path = getattr(model_config, "local_path", None) or model_config.path
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, str(getattr(config, "dtype", "bfloat16"))) if self.device.type == "cuda" else torch.float32
        trust = bool(getattr(model_config, "trust_remote_code", False))
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust)
        self.model = model.to(self.device).eval()
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
        self.eos_ids = _eos_ids(self.model.generation_config.eos_token_id, tok.eos_token_id)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_ids[0]
        self.response_length = int(config.response_length)
        self.max_model_len = int(getattr(config, "max_model_len", None) or 0)
        self.global_steps: int | None = None
        self.queues: dict[tuple, list[_Request]] = {}
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None  # the batching loop, started in the event loop of the first request
        self.generated_tokens = 0

    # -- generation ---------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str = "", **_: Any) -> TokenOutput:
        """Sample a response to ``prompt_ids`` (VeRL's server contract); the response ends with EOS when it completed."""
        loop = asyncio.get_running_loop()
        if self.worker is None or self.worker.done() or self.worker.get_loop() is not loop:
            self.wake = asyncio.Event()
            self.worker = loop.create_task(self._serve(self.wake))
        room = self.max_model_len - len(prompt_ids) if self.max_model_len else self.response_length
        max_tokens = min(int(sampling_params.get("max_tokens") or self.response_length), self.response_length, room)
        if max_tokens <= 0:
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="length", extra_fields={"global_steps": self.global_steps})
        future = asyncio.get_running_loop().create_future()
        self.queues.setdefault(_sampling_key(sampling_params), []).append(_Request(list(prompt_ids), max_tokens, future))
        self.wake.set()  # type: ignore[union-attr]
        ids, logprobs, finished = await future
        return TokenOutput(
            token_ids=ids, log_probs=logprobs, stop_reason="completed" if finished else "length",
            extra_fields={"global_steps": self.global_steps},
        )

    async def _serve(self, wake: asyncio.Event) -> None:
        while True:
            await wake.wait()
            await asyncio.sleep(BATCH_WINDOW_S)
            wake.clear()
            batches, self.queues = self.queues, {}
            for key, requests in batches.items():
                try:
                    results = await asyncio.to_thread(self._generate_batch, [r.prompt_ids for r in requests], max(r.max_tokens for r in requests), key)
                except Exception as exc:  # every waiting request sees the failure; the server keeps serving
                    for r in requests:
                        if not r.future.done():
                            r.future.set_exception(exc)
                    continue
                for r, (ids, lps, done) in zip(requests, results, strict=True):
                    if len(ids) > r.max_tokens:
                        ids, lps, done = ids[: r.max_tokens], (lps[: r.max_tokens] if lps is not None else None), False
                    if not r.future.done():
                        r.future.set_result((ids, lps, done))

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], max_tokens: int, key: tuple) -> list[tuple[list[int], list[float] | None, bool]]:
        temperature, top_p, top_k, repetition_penalty, want_logprobs = key
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token sits at the same position
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        sample = temperature > 0
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=max_tokens,
            do_sample=sample, temperature=temperature if sample else None, top_p=top_p if sample else None,
            top_k=top_k if sample else None, repetition_penalty=repetition_penalty, pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids, return_dict_in_generate=True, output_logits=want_logprobs,
        )
        new = out.sequences[:, width:].tolist()
        logprobs = None
        if want_logprobs:  # log-probs of the sampled tokens under the model's own distribution (as vLLM reports them)
            logits = torch.stack(out.logits, dim=1).float().log_softmax(-1)
            logprobs = logits.gather(-1, out.sequences[:, width:, None]).squeeze(-1).tolist()
        results = []
        for i, row in enumerate(new):
            end = next((j + 1 for j, t in enumerate(row) if t in self.eos_ids), None)
            cut = end if end is not None else len(row)
            self.generated_tokens += cut
            results.append((row[:cut], logprobs[i][:cut] if logprobs is not None else None, end is not None))
        return results

    # -- weights and memory -------------------------------------------------------------------------
    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the trainer's weights (HF names); return how many tensors were loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"hf rollout: the trainer sent weights the rollout model lacks ({', '.join(unknown[:3])}…): same model path on both sides?")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].device))
        if global_steps is not None:
            self.global_steps = global_steps
        return len(state)

    def sleep(self) -> None:
        """Move the model off the GPU for the training phase."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Move the model back onto the GPU (any tag: weights and cache are one thing here)."""
        self.model.to(self.device)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        return {"device": str(self.device), "generated_tokens": self.generated_tokens, "global_steps": self.global_steps}

    # VeRL's replica calls these on every server; transformers keeps no cache between requests.
    def clear_kv_cache(self) -> None: ...
    def release_kv_cache(self) -> None: ...
    def resume_kv_cache(self) -> None: ...
    def resume_generation(self) -> None: ...
    def wait_for_requests_to_drain(self) -> None: ...
    def start_profile(self, **_: Any) -> None: ...
    def stop_profile(self) -> None: ...

    def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}


def _eos_ids(*sources: Any) -> list[int]:
    ids: list[int] = []
    for s in sources:
        for t in (s if isinstance(s, (list, tuple)) else [s]):
            if t is not None and int(t) not in ids:
                ids.append(int(t))
    if not ids:
        raise ValueError("hf rollout: the model names no EOS token (set eos_token_id in its generation_config.json)")
    return ids


class HFServerAdapter(BaseRollout):
    """VeRL's rollout object in a trainer worker: sends the actor's weights to this replica's :class:`HFServer`."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size * self.config.pipeline_model_parallel_size
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.is_leader_rank = self.rollout_rank == 0
        self.server_handle: Any = None

    def _server(self) -> Any:
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        if self.config.free_cache_engine and self.is_leader_rank:
            await self._server().wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.config.free_cache_engine and self.is_leader_rank:
            await self._server().sleep.remote()

    @torch.no_grad()
    async def update_weights(self, weights: Any, global_steps: int | None = None, wire_format: str = "named_tensors", **_: Any) -> None:
        """Send the full weights (every rank walks the generator: gathering a sharded tensor is collective)."""
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout takes full weights (checkpoint_engine.backend=naive), not {wire_format!r}")
        state = {}
        for name, tensor in weights:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.is_leader_rank:
                state[name] = full.detach().to("cpu", copy=True)
        if self.is_leader_rank:
            await self._server().update_weights.remote(state, global_steps)

    def generate_sequences(self, prompts: Any) -> Any:
        raise NotImplementedError("hf rollout serves VeRL's agent loop (rollout.mode=async); there is no synchronous generate_sequences")


class HFReplica(RolloutReplica):
    """One :class:`HFServer` per replica, on the node and GPU of the replica's workers."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise NotImplementedError(
                f"hf rollout runs one GPU per replica: set rollout tensor/data/pipeline parallel sizes to 1 (world size {self.world_size})"
            )
        worker = self.workers[0]
        node_id, gpu = await worker.__ray_call__.remote(
            lambda self: (ray.get_runtime_context().get_node_id(), (ray.get_runtime_context().get_accelerator_ids().get("GPU") or [None])[0])
        )
        suffix = "_reward" if self.is_reward_model else "_teacher" if self.is_teacher_model else ""
        server = ray.remote(HFServer).options(
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}},
            name=server_name(self.replica_rank, 0, f"{suffix}{self.name_suffix}"),
            max_concurrency=self.max_concurrency,
            num_cpus=0,
        ).remote(config=self.config, model_config=self.model_config, cuda_visible_devices=gpu)
        await server.stats.remote()  # the model is loaded: construction errors surface here
        self.servers = [server]
        self._server_handle = server
        self._server_address = server_name(self.replica_rank, 0, f"{suffix}{self.name_suffix}")  # no HTTP endpoint


_ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
