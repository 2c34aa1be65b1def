"""A transformers rollout backend for VeRL 0.9 (``actor_rollout_ref.rollout.name=hf``).

VeRL 0.9 generates only through rollout *servers* (vLLM, SGLang, TensorRT-LLM): the agent loop sends token ids
to a server actor and gets token ids back; the trainer pushes its weights to the server after every update. Those
engines are large (vLLM 0.24's wheel alone is 266 MiB) and pin their own torch. This backend is the same contract
served by ``transformers`` ``generate`` on the GPU the trainer uses: slower per token than vLLM, but with nothing
to install beyond what VeRL already needs, and exact for small writers (SmolLM2-135M, the tiny test models).

Three parts, as for vLLM:

- :class:`HFServer` — a Ray actor holding the model; ``generate`` batches concurrent requests (left-padded, one
  ``generate`` call per group of equal sampling parameters and length, at most ``max_num_seqs`` rows) and returns
  VeRL's ``TokenOutput`` with the sampled tokens' log-probs; ``update_weights`` loads the trainer's weights;
  ``sleep``/``wake_up`` move the model off and back onto the GPU around the training phase.
- :class:`HFServerAdapter` — VeRL's ``BaseRollout`` inside each trainer worker: streams the actor's full weights to
  the server (every rank walks the generator, since gathering a sharded tensor is collective; each replica's leader
  rank sends).
- :class:`HFReplica` — VeRL's ``RolloutReplica``: starts one server per replica on its workers' node and GPU.

Importing this module registers ``hf`` with VeRL (``VERL_USE_EXTERNAL_MODULES=dualmem.training.verl.hf_rollout``,
which :func:`dualmem.training.verl.config.launch_env` sets when ``rollout_engine`` is ``hf``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass, field
from typing import Any, cast

import ray
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

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
    future: asyncio.Future = field(repr=False)


class HFServer:
    """Ray actor: one transformers model on one GPU (or the CPU), serving VeRL's token-in-token-out ``generate``.

    Its GPU is chosen by ``CUDA_VISIBLE_DEVICES`` in the actor's environment (:class:`HFReplica` sets it before the
    process starts: importing VeRL initialises CUDA, after which the variable is no longer read).
    """

    def __init__(self, config: Any, model_config: Any, **_: Any) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        path = getattr(model_config, "local_path", None) or model_config.path
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = (
            getattr(torch, str(getattr(config, "dtype", "bfloat16"))) if self.device.type == "cuda" else torch.float32
        )
        trust = bool(getattr(model_config, "trust_remote_code", False))
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust)
        self.model = model.to(self.device).eval()
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
        self.eos_ids = _eos_ids(self.model.generation_config.eos_token_id, tok.eos_token_id)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_ids[0]
        self.response_length = int(config.response_length)
        self.max_model_len = int(
            getattr(config, "max_model_len", None) or getattr(model.config, "max_position_embeddings", 0) or 0
        )
        self.max_batch = int(getattr(config, "max_num_seqs", 0) or 256)
        self.raw_logprobs = str(getattr(config, "logprobs_mode", "processed_logprobs")).startswith("raw")
        self.free_cache_engine = bool(getattr(config, "free_cache_engine", True))
        self.global_steps: int | None = None
        self.queues: dict[tuple, list[_Request]] = {}
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None  # the batching loop, started in the event loop of the first request
        self.busy = 0  # requests taken from the queues and not answered yet
        self.lock = threading.Lock()  # one of: a generate batch, a weight load, a device move
        self.generated_tokens = 0

    # -- generation ---------------------------------------------------------------------------------
    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str = "", **_: Any
    ) -> TokenOutput:
        """Sample a response to ``prompt_ids`` (VeRL's server contract); the response ends with EOS when it completed."""
        loop = asyncio.get_running_loop()
        if self.worker is None or self.worker.done() or self.worker.get_loop() is not loop:
            self.wake = asyncio.Event()
            self.worker = loop.create_task(self._serve(self.wake))
        room = self.max_model_len - len(prompt_ids) if self.max_model_len else self.response_length
        max_tokens = min(int(sampling_params.get("max_tokens") or self.response_length), self.response_length, room)
        if max_tokens <= 0:
            return TokenOutput(
                token_ids=[], log_probs=[], stop_reason="length", extra_fields={"global_steps": self.global_steps}
            )
        future = loop.create_future()
        self.queues.setdefault((*_sampling_key(sampling_params), max_tokens), []).append(
            _Request(list(prompt_ids), future)
        )
        self.wake.set()  # type: ignore[union-attr]
        ids, logprobs, finished = await future
        return TokenOutput(
            token_ids=ids,
            log_probs=logprobs,
            stop_reason="completed" if finished else "length",
            extra_fields={"global_steps": self.global_steps},
        )

    async def _serve(self, wake: asyncio.Event) -> None:
        """Answer queued requests in batches of equal sampling parameters and length (at most ``max_num_seqs`` each)."""
        taken: list[_Request] = []
        try:
            while True:
                await wake.wait()
                await asyncio.sleep(BATCH_WINDOW_S)
                wake.clear()
                key = next(iter(self.queues), None)
                if key is None:
                    continue
                queue = self.queues[key]
                taken, rest = queue[: self.max_batch], queue[self.max_batch :]
                if rest:
                    self.queues[key] = rest
                else:
                    del self.queues[key]
                if self.queues:
                    wake.set()  # more to answer after this batch
                self.busy += len(taken)
                try:
                    results = await asyncio.to_thread(self._generate_batch, [r.prompt_ids for r in taken], key)
                except Exception as exc:  # noqa: BLE001 - every request of the batch sees the failure; the server keeps serving
                    for r in taken:
                        if not r.future.done():
                            r.future.set_exception(exc)
                else:
                    for r, result in zip(taken, results, strict=True):
                        if not r.future.done():
                            r.future.set_result(result)
                finally:
                    self.busy -= len(taken)
                    taken = []
        finally:  # the loop stopped (cancelled, or a bug): no request may wait forever
            stopped = RuntimeError("hf rollout: the server's batching loop stopped")
            for r in [*taken, *(r for q in self.queues.values() for r in q)]:
                if not r.future.done():
                    r.future.set_exception(stopped)
            self.queues = {}

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], key: tuple) -> list[tuple[list[int], list[float] | None, bool]]:
        temperature, top_p, top_k, repetition_penalty, want_logprobs, max_tokens = key
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token sits at the same position
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        sample = temperature > 0
        with self.lock:
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=max_tokens,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=top_p if sample else None,
                top_k=top_k if sample else None,
                repetition_penalty=repetition_penalty,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids,
                return_dict_in_generate=True,
                output_logits=want_logprobs and self.raw_logprobs,
                output_scores=want_logprobs and not self.raw_logprobs,
            )
        new = out.sequences[:, width:]
        logprobs = None
        if want_logprobs:
            # VeRL's default logprobs_mode, processed_logprobs: the distribution sampled from (temperature, top-k, top-p
            # applied), as vLLM reports it; raw_logprobs: the model's own. One step at a time: no batch x steps x vocab copy.
            steps = out.logits if self.raw_logprobs else out.scores
            logprobs = torch.stack(
                [s.float().log_softmax(-1).gather(-1, new[:, t, None]).squeeze(-1) for t, s in enumerate(steps)], 1
            ).tolist()
        results = []
        for i, row in enumerate(new.tolist()):
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
            raise ValueError(
                f"hf rollout: the trainer sent weights the rollout model lacks ({', '.join(unknown[:3])}…): same model path on both sides?"
            )
        with self.lock, torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].device))
        if global_steps is not None:
            self.global_steps = global_steps
        return len(state)

    def sleep(self) -> None:
        """Move the model off the GPU for the training phase (only with ``free_cache_engine``, as VeRL wakes it only then)."""
        if self.device.type == "cuda" and self.free_cache_engine:
            with self.lock:
                self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Move the model back onto the GPU (any tag: weights and cache are one thing here)."""
        with self.lock:
            self.model.to(self.device)

    async def wait_for_requests_to_drain(self) -> None:
        """Return once no request is queued or being generated."""
        while self.busy or any(self.queues.values()):
            await asyncio.sleep(0.01)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        info = {
            "device": str(self.device),
            "generated_tokens": self.generated_tokens,
            "global_steps": self.global_steps,
        }
        if self.device.type == "cuda":
            info["gpu_uuid"] = str(torch.cuda.get_device_properties(self.device).uuid)
        return info

    # VeRL's replica calls these on every server; transformers keeps no cache between requests, and requests are
    # not aborted (a batch in flight finishes; weight loads wait for it).
    def clear_kv_cache(self) -> None: ...
    def release_kv_cache(self) -> None: ...
    def resume_kv_cache(self) -> None: ...
    def resume_generation(self) -> None: ...
    def start_profile(self, **_: Any) -> None: ...
    def stop_profile(self) -> None: ...

    def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}


def _eos_ids(*sources: Any) -> list[int]:
    ids: list[int] = []
    for s in sources:
        for t in s if isinstance(s, (list, tuple)) else [s]:
            if t is not None and int(t) not in ids:
                ids.append(int(t))
    if not ids:
        raise ValueError("hf rollout: the model names no EOS token (set eos_token_id in its generation_config.json)")
    return ids


class HFServerAdapter(BaseRollout):
    """VeRL's rollout object in a trainer worker: sends the actor's weights to this replica's :class:`HFServer`."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
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
    async def update_weights(
        self,
        weights: Any,
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        peft_config: Any = None,
        **_: Any,
    ) -> None:
        """Send the full weights (every rank walks the generator: gathering a sharded tensor is collective)."""
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"hf rollout takes full weights (checkpoint_engine.backend=naive), not {wire_format!r}"
            )
        if peft_config is not None:
            raise NotImplementedError(
                "hf rollout takes merged weights: set actor_rollout_ref.model.lora.merge=true for LoRA training"
            )
        state = {}
        for name, tensor in weights:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.is_leader_rank:
                state[name] = full.detach().to("cpu", copy=True)
        if self.is_leader_rank:
            await self._server().update_weights.remote(state, global_steps)

    def generate_sequences(self, prompts: Any) -> Any:
        raise NotImplementedError(
            "hf rollout serves VeRL's agent loop (rollout.mode=async); there is no synchronous generate_sequences"
        )


class HFReplica(RolloutReplica):
    """One :class:`HFServer` per replica, on the node and GPU of the replica's workers."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise NotImplementedError(
                f"hf rollout runs one GPU per replica: set rollout tensor/data/pipeline parallel sizes to 1 (world size {self.world_size})"
            )
        worker = self.workers[0]
        node_id, gpu = await worker.__ray_call__.remote(
            lambda self: (
                ray.get_runtime_context().get_node_id(),
                next(iter(ray.get_runtime_context().get_accelerator_ids().get("GPU") or []), None),
            )
        )
        suffix = "_reward" if self.is_reward_model else "_teacher" if self.is_teacher_model else ""
        name = server_name(self.replica_rank, 0, f"{suffix}{self.name_suffix}")
        env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}  # the worker's GPU, set before the process starts
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        server = (
            cast(Any, ray.remote(HFServer))
            .options(
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                ),
                runtime_env={"env_vars": env},
                name=name,
                max_concurrency=self.max_concurrency,
                num_cpus=0,
            )
            .remote(config=self.config, model_config=self.model_config)
        )
        await server.stats.remote()  # the model is loaded: construction errors surface here
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # no HTTP endpoint


_ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
