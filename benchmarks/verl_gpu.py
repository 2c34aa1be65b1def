"""Real VeRL 0.9.1 GRPO steps of the writer on one GPU, with the transformers rollout backend (``rollout_engine=hf``).

Two stages, so that the GPU machine only runs VeRL:

``prepare`` (CPU, here): the data and the policy of ``benchmarks/grpo_tiny_cpu.py`` — RoleMemo histories from the
scripted weave model, 8 training histories (``mara`` and renamed copies) and the held-out persona ``chen-wei`` as
VeRL's validation set; a tiny random Llama (2 layers, 32 wide, byte-level BPE) with a short SFT warm start on gold
targets, so part of its turns parse. Everything lands in ``--work`` (a few MB)::

    python benchmarks/verl_gpu.py prepare --work .verl-gpu

``run`` (the GPU machine): ``python -m verl.trainer.main_ppo`` with ``dualmem.training.verl.config.overrides`` —
FSDP actor and reference, GRPO advantages, the writer agent loop, the dense reward — validating on the held-out
persona before training and every ``--test-freq`` steps; the console log is parsed into the result file::

    python benchmarks/verl_gpu.py run --work .verl-gpu --steps 24 --out benchmarks/results/verl_gpu.json

The judge embedder and the rollouts' memory embedder are ``hash:64`` (lexical; the MiniLM weights were not sent to the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]
KEYS = (
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "response_length/mean",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/kl_loss",
    "actor/entropy",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/update_weights",
)
MEMORY_EMBEDDER = "hash:64"  # the rollouts' memory store and the reward's recall (no MiniLM weights on the GPU machine)


def prepare(args: argparse.Namespace) -> None:
    import torch
    from fixtures.tiny_model import tiny_llama, tiny_tokenizer
    from grpo_tiny_cpu import HELD_OUT, make_data

    from dualmem.schema import Dataset
    from dualmem.training.episode import build_episode, gold_steps
    from dualmem.training.export import gold_records, write_jsonl
    from dualmem.training.sft import SFTRunConfig, train_sft
    from dualmem.training.verl.dataset import write_verl_dataset
    from dualmem.training.writing import writer_context

    torch.manual_seed(0)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    train, held = make_data(work / "gen", args.train_personas, args.length)
    eps = [build_episode(i, chunk_tokens=args.chunk_tokens) for i in train.items]
    ctx = writer_context(embedder=MEMORY_EMBEDDER, chunk_tokens=args.chunk_tokens)
    steps = [s for e in eps for s in gold_steps(e, ctx)]
    texts = [m["content"] for s in steps for m in s.messages] + [s.target.model_dump_json() for s in steps]
    tok = tiny_tokenizer(texts)
    model = tiny_llama(tok)
    write_jsonl(work / "sft.jsonl", gold_records(train, keep_empty=1.0, ctx=ctx))
    sft = SFTRunConfig(
        train_file=str(work / "sft.jsonl"),
        output_dir=str(work / "sft-run"),
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        warmup_ratio=0.0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_steps=args.sft_steps,
        max_length=2048,
        logging_steps=10,
        save_steps=10_000,
        use_cpu=True,
        disable_tqdm=True,
    )
    t0 = time.time()
    out = train_sft(sft, model=model, tokenizer=tok)
    model.save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    both = Dataset(name="verl-gpu", items=[*train.items, *held.items])
    counts = write_verl_dataset(
        both, work / "data", chunk_tokens=args.chunk_tokens, val_personas=[HELD_OUT], memory_embedder=MEMORY_EMBEDDER
    )
    meta = {
        "sft_steps": args.sft_steps,
        "sft_final_loss": round(out["train_loss"], 4),
        "sft_seconds": round(time.time() - t0, 1),
        "train_histories": [i.dialogue.id for i in train.items],
        "heldout_histories": [i.dialogue.id for i in held.items],
        "chunk_tokens": args.chunk_tokens,
        "rows": {k: counts[k] for k in ("train", "val")},
    }
    meta["command"] = "python " + " ".join(sys.argv)
    (work / "prepared.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))


def parse_log(text: str) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Return (training steps, validations) from VeRL's console logger lines ``step:N - key:value - ...``."""
    steps, vals = [], []
    for line in text.splitlines():
        m = re.search(r"step:(\d+) - (.*)$", line)
        if not m:
            continue
        fields = dict(
            re.findall(r"([\w@/\-.]+):(?:np\.\w+\()?(-?\d[\d.]*(?:e[-+]?\d+)?)", m.group(2))
        )  # pformat: np.float64(0.1)
        row = {"step": int(m.group(1))}
        train = {k: float(f"{float(fields[k]):.6g}") for k in KEYS if k in fields}
        val = {
            k.removeprefix("val-core/").removeprefix("val-aux/"): float(f"{float(v):.6g}")
            for k, v in fields.items()
            if k.startswith("val-")
        }
        if train:
            steps.append({**row, **train})
        if val:
            vals.append({**row, **val})
    return steps, vals


def run(args: argparse.Namespace) -> None:
    import torch

    from dualmem.training.verl.config import VerlRunConfig, launch_env, overrides, write_agent_loop_yaml

    work = Path(args.work).resolve()
    write_agent_loop_yaml(
        work / "data", memory_embedder=MEMORY_EMBEDDER
    )  # the episodes' path where the folder is now (it may have been moved)
    cfg = VerlRunConfig(
        model_path=str(work / "model"),
        data_dir=str(work / "data"),
        output_dir=str(work / "run"),
        rollout_engine="hf",
        rollout_n=args.n,
        train_batch_size=args.batch,
        ppo_mini_batch_size=args.mini_batch,
        micro_batch_size_per_gpu=args.mini_batch * args.n,
        max_prompt_length=2048,
        max_response_length=args.response,
        total_training_steps=args.steps,
        learning_rate=args.lr,
        n_gpus_per_node=1,
        embedder="hash:64",
        save_freq=-1,
        test_freq=args.test_freq,
        logger="console",
    )
    extra = [
        "trainer.use_v1=false",
        "trainer.val_before_train=true",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.rollout.val_kwargs.n={args.val_n}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"ray_kwargs.ray_init.num_cpus={os.cpu_count() or 4}",
        "data.dataloader_num_workers=0",
        *args.override,
    ]
    env = launch_env(
        {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}, rollout_engine="hf"
    )
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(cfg), *extra]
    t0 = time.time()
    log_path = Path(args.log or work / "verl.log")
    with open(log_path, "w") as log:  # its own session, so a timeout stops VeRL's Ray processes too
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:  # the steps done so far are still in the log
            code = 124
            _stop(proc)
    text = log_path.read_text(errors="replace")
    steps, vals = parse_log(text)
    meta = json.loads((work / "prepared.json").read_text()) if (work / "prepared.json").exists() else {}
    result = {
        "what": "held-out writer reward (persona chen-wei, never trained on) before and during VeRL GRPO of the SFT-warmed tiny Llama; "
        "VeRL 0.9.1 FSDP actor, transformers rollout backend (rollout.name=hf), hash:64 judge",
        "command": "python " + " ".join(sys.argv),
        "returncode": code,
        "seconds": round(time.time() - t0, 1),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "versions": _versions(),
        "prepared": meta,
        "settings": {
            k: getattr(cfg, k)
            for k in (
                "rollout_n",
                "train_batch_size",
                "ppo_mini_batch_size",
                "max_response_length",
                "total_training_steps",
                "learning_rate",
                "kl_loss_coef",
                "test_freq",
            )
        }
        | {"val_n": args.val_n, "extra": extra},
        "validation": vals,
        "train_steps": steps,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {
                "returncode": code,
                "validation": [(v["step"], {k: v[k] for k in v if "score" in k or "reward" in k}) for v in vals],
                "train": [(s["step"], s.get("critic/score/mean")) for s in steps],
            },
            indent=None,
        )
    )
    if code != 0:
        print(text[-6000:])
    raise SystemExit(code)


def _stop(proc: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("verl", "ray", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("prepare", help="data and the SFT-warmed tiny policy (CPU)")
    p.add_argument("--work", default=".verl-gpu")
    p.add_argument("--train-personas", type=int, default=8)
    p.add_argument("--length", type=int, default=1500)
    p.add_argument("--chunk-tokens", type=int, default=400)
    p.add_argument("--sft-steps", type=int, default=200)
    r = sub.add_parser("run", help="VeRL GRPO on the GPU, validated on the held-out persona")
    r.add_argument("--work", default=".verl-gpu")
    r.add_argument("--out", default="benchmarks/results/verl_gpu.json")
    r.add_argument("--log", default="")
    r.add_argument("--steps", type=int, default=24)
    r.add_argument("--test-freq", type=int, default=4)
    r.add_argument("--n", type=int, default=8, help="rollouts per group")
    r.add_argument("--batch", type=int, default=8, help="writing turns per step")
    r.add_argument("--mini-batch", type=int, default=8)
    r.add_argument("--response", type=int, default=96)
    r.add_argument("--lr", type=float, default=5e-4)
    r.add_argument("--val-n", type=int, default=16)
    r.add_argument("--timeout", type=int, default=1200)
    r.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    args = ap.parse_args()
    prepare(args) if args.stage == "prepare" else run(args)


if __name__ == "__main__":
    main()
