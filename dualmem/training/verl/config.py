"""VeRL 0.9 GRPO launch configuration for the writer, composed with VeRL's own Hydra config.

:func:`overrides` turns a :class:`VerlRunConfig` into Hydra overrides of VeRL's
``ppo_trainer`` config (paper defaults: rollout n 8, batch 16, mini-batch 4,
lr 1e-6, KL loss 0.001 ``low_var_kl``, chunks of 4,000 tokens, responses of at
most 1,024 tokens; GRPO advantages, vLLM async rollouts, FSDP actor, the
``dualmem_writer`` agent loop and :func:`dualmem.training.rewards.compute_score`).
:func:`compose` builds the full config with VeRL's Hydra files and
:func:`validate` runs VeRL's own ``validate_config``. :func:`write_launch`
writes the documented YAML and the agent-loop registration next to the data.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dualmem.config import setting_default
from dualmem.errors import ConfigurationError
from dualmem.training.run_config import JudgeFields, help_field

AGENT_NAME = "dualmem_writer"
PACKAGE = Path(__file__).resolve().parent


@dataclass
class VerlRunConfig(JudgeFields):
    """Settings of a VeRL GRPO run of the writer (paper defaults; the judge fields come from :class:`JudgeFields`)."""

    model_path: str = help_field("", "policy checkpoint (usually the SFT output), local folder or hub id")
    data_dir: str = help_field(
        "runs/verl/data",
        "folder with train.parquet, val.parquet, episodes.jsonl (`dualmem train rl --engine verl --prepare`)",
    )
    output_dir: str = help_field("runs/verl", "checkpoints and logs")
    rollout_n: int = help_field(8, "rollouts per group (paper: 8)")
    train_batch_size: int = help_field(16, "prompts (writing turns) per step (paper: 16)")
    ppo_mini_batch_size: int = help_field(4, "mini-batch of the actor update (paper: 4)")
    micro_batch_size_per_gpu: int = help_field(1, "micro-batch per GPU for the actor, reference and log-prob passes")
    learning_rate: float = help_field(1e-6, "actor learning rate (paper: 1e-6)")
    kl_loss_coef: float = help_field(0.001, "KL loss coefficient (paper: 0.001)")
    kl_loss_type: str = help_field("low_var_kl", "KL estimator (paper: low_var_kl)")
    chunk_tokens: int = help_field(4000, "history chunk size in tokens (paper: 4,000)")
    memory_embedder: str = help_field(
        "",
        "embedder of each rollout's memory store (its working view's search, dedup), written to agent_loop.yaml by "
        "--prepare; empty: the embedder setting's, as the product writes",
    )
    max_prompt_length: int = help_field(6144, "prompt budget: persona + working view + a 4,000-token chunk")
    max_response_length: int = help_field(1024, "max tokens of one MemoryUpdate (paper: 1,024)")
    total_training_steps: int = help_field(200, "optimizer steps")
    n_gpus_per_node: int = help_field(8, "GPUs per node")
    nnodes: int = help_field(1, "nodes")
    tensor_parallel_size: int = help_field(1, "vLLM tensor parallel size of rollouts")
    gpu_memory_utilization: float = help_field(0.5, "share of GPU memory vLLM may use")
    rollout_engine: str = help_field(
        "vllm",
        "rollout backend: vllm, sglang, or hf (transformers on the trainer's GPU, dualmem.training.verl.hf_rollout)",
    )
    device: str = help_field("cuda", "cuda, or cpu for the smoke run (gloo, no NCCL)")
    project_name: str = help_field("dualmem", "tracker project")
    experiment_name: str = help_field("writer-grpo", "tracker run name")
    logger: str = help_field("console", "trackers: console, wandb, tensorboard (comma separated)")
    save_freq: int = help_field(50, "checkpoint every N steps (-1: never)")
    test_freq: int = help_field(-1, "validate every N steps (-1: never)")


def overrides(cfg: VerlRunConfig) -> list[str]:
    """Return the Hydra overrides of VeRL's ``ppo_trainer`` config for ``cfg``."""
    if not cfg.model_path:
        raise ConfigurationError("no policy: pass --model-path (the SFT checkpoint folder or a hub id)")
    if cfg.rollout_engine not in ENGINES:
        raise ConfigurationError(f"rollout_engine {cfg.rollout_engine!r} is not one of {', '.join(ENGINES)}")
    data = Path(cfg.data_dir).resolve()
    loggers = "[" + ",".join(f"'{x.strip()}'" for x in cfg.logger.split(",") if x.strip()) + "]"
    reward_kwargs = f"{{embedder:'{cfg.embedder}',judge_weight:{cfg.judge_weight},judge_model:'{cfg.judge_model}'}}"
    micro = cfg.micro_batch_size_per_gpu
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        f"data.train_batch_size={cfg.train_batch_size}",
        f"data.max_prompt_length={cfg.max_prompt_length}",
        f"data.max_response_length={cfg.max_response_length}",
        "data.return_raw_chat=true",
        "data.shuffle=false",
        "data.filter_overlong_prompts=false",
        f"actor_rollout_ref.model.path={cfg.model_path}",
        f"actor_rollout_ref.actor.optim.lr={cfg.learning_rate}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.ppo_mini_batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.actor.kl_loss_coef={cfg.kl_loss_coef}",
        f"actor_rollout_ref.actor.kl_loss_type={cfg.kl_loss_type}",
        "actor_rollout_ref.actor.strategy=fsdp",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.name={cfg.rollout_engine}",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={cfg.rollout_n}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={cfg.tensor_parallel_size}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={cfg.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={data / 'agent_loop.yaml'}",
        f"reward.custom_reward_function.path={PACKAGE / 'reward_fn.py'}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs={reward_kwargs}",
        f"trainer.project_name={cfg.project_name}",
        f"trainer.experiment_name={cfg.experiment_name}",
        f"trainer.logger={loggers}",
        f"trainer.n_gpus_per_node={cfg.n_gpus_per_node}",
        f"trainer.nnodes={cfg.nnodes}",
        f"trainer.device={cfg.device}",
        f"trainer.total_training_steps={cfg.total_training_steps}",
        f"trainer.save_freq={cfg.save_freq}",
        f"trainer.test_freq={cfg.test_freq}",
        "trainer.val_before_train=false",
        "trainer.critic_warmup=0",
        f"trainer.default_local_dir={Path(cfg.output_dir).resolve() / 'checkpoints'}",
        *(HF_OVERRIDES if cfg.rollout_engine == "hf" else []),
    ]


ENGINES = ("vllm", "sglang", "hf")
HF_MODULE = "dualmem.training.verl.hf_rollout"  # registers rollout.name=hf with VeRL when imported
# the hf server receives full weights from the trainer process it shares a GPU with
HF_OVERRIDES = ["actor_rollout_ref.rollout.checkpoint_engine.backend=naive"]


def _verl_config_dir() -> str:
    try:
        import verl
    except ImportError as exc:
        raise ConfigurationError(
            "VeRL is not installed: `pip install verl==0.9.1` (or use the .venv-verl venv, see docs/training.md)"
        ) from exc
    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def compose(cfg: VerlRunConfig, extra: list[str] = ()) -> Any:  # type: ignore[assignment]
    """Compose VeRL's ``ppo_trainer`` Hydra config with this run's overrides (plus ``extra``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=[*overrides(cfg), *extra])


def validate(config: Any) -> None:
    """Run VeRL's own checks on a composed config (batch divisibility, micro-batches, KL settings)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


AGENT_LOOP_YAML = """# VeRL agent-loop registration of the DualMem writer (read by AgentLoopWorker)
- name: {name}
  _target_: dualmem.training.verl.agent_loop.DualMemWriterAgentLoop
  episodes_path: {episodes}
  view_k: {view_k}
  view_recent: {view_recent}
  memory_embedder: {memory_embedder}
"""


def write_agent_loop_yaml(
    data_dir: str | Path,
    view_k: int = setting_default("view_k"),
    view_recent: int = setting_default("view_recent"),
    memory_embedder: str = "",
) -> Path:
    """Write ``agent_loop.yaml`` registering the writer agent loop with the episodes file and the rollouts' working view
    (``memory_embedder``: the embedder of each rollout's memory store; empty: the embedder setting's)."""
    data = Path(data_dir).resolve()
    path = data / "agent_loop.yaml"
    path.write_text(
        AGENT_LOOP_YAML.format(
            name=AGENT_NAME,
            episodes=data / "episodes.jsonl",
            view_k=view_k,
            view_recent=view_recent,
            memory_embedder=json.dumps(memory_embedder),
        )
    )
    return path


SITE = PACKAGE / "site"  # sitecustomize.py: hides a TRL without the value-head class VeRL patches
REPO = PACKAGE.parents[2]  # the folder holding the dualmem package (VeRL imports the agent loop and reward from it)


def verl_python(python: str = "") -> str:
    """Return the interpreter of VeRL runs: ``python``, else the repository's ``.venv-verl/bin/python`` when present, else this one.

    The venv's path is kept as is (not symlink-resolved): resolving it lands on the base interpreter, outside the venv.
    """
    local = REPO / ".venv-verl" / "bin" / "python"
    return python or (str(local.absolute()) if local.exists() else sys.executable)


def launch_env(env: dict[str, str] | None = None, rollout_engine: str = "vllm") -> dict[str, str]:
    """Return the environment of a VeRL run: the site folder and the repository first on ``PYTHONPATH``.

    With the ``hf`` engine, VeRL also imports :mod:`dualmem.training.verl.hf_rollout` in every process.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), str(REPO), env.get("PYTHONPATH", "")]))
    if rollout_engine == "hf":
        modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        if HF_MODULE not in modules:
            modules.append(HF_MODULE)
        env["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
    return env


def write_launch(cfg: VerlRunConfig, path: str | Path | None = None, python: str = "") -> Path:
    """Write a documented launch YAML (every override, with the field help as comments) and return its path.

    Its header holds the command that runs it as written (each ``- `` line is one Hydra override).
    """
    path = Path(path or Path(cfg.output_dir) / "verl_launch.yaml").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    helps = {f.name: f.metadata["help"] for f in fields(VerlRunConfig)}
    hf = f"VERL_USE_EXTERNAL_MODULES={HF_MODULE} " if cfg.rollout_engine == "hf" else ""
    pythonpath = shlex.quote(f"{SITE}{os.pathsep}{REPO}")
    run = (
        f"sed -n 's/^- //p' {shlex.quote(str(path))} | {hf}PYTHONPATH={pythonpath} "
        f"xargs -d '\\n' {shlex.quote(verl_python(python))} -m verl.trainer.main_ppo"
    )
    lines = [
        "# DualMem writer — VeRL 0.9 GRPO launch config (generated by `dualmem train rl --engine verl`).",
        f"# Run: {run}",
        "# (or `dualmem train rl --engine verl --no-prepare --launch` with the same settings)",
        "# Settings (paper defaults unless changed):",
        *[f"#   {k} = {getattr(cfg, k)!r}  — {helps[k]}" for k in helps],
        "overrides:",
        *[f"- {o}" for o in overrides(cfg)],
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
