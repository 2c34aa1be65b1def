"""A small CPU GRPO run (TRL) of the writer on a tiny random Llama: does the held-out reward rise over the steps?

Data: RoleMemo histories generated offline by the scripted weave model (``fake:weave``) for two personas —
training on one persona's history, the held-out reward measured on the other's (its fragments differ). The tiny
model (2 layers, 32 wide, byte-level BPE trained on the data) starts from random weights, gets a short SFT warm
start on gold targets (sentences about the user), then GRPO with the dense reward; the held-out reward is the mean
episode reward of ``--eval-rollouts`` sampled rollouts of the held-out history, measured every ``--eval-every`` steps.

    nice -n 19 python benchmarks/grpo_tiny_cpu.py --out benchmarks/results/grpo_tiny_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout first; the tiny model fixture


def make_data(work: Path) -> tuple[object, object]:
    from dualmem.config import Settings
    from dualmem.datasets import load_dataset
    from dualmem.generate import generate_rolememo
    from dualmem.testing import HashEmbeddings

    personas = REPO / "tests" / "fixtures" / "personas"
    out = generate_rolememo(personas, work / "data", lengths=(1500,), model="fake:weave", embeddings=HashEmbeddings(64),
                            settings=Settings(checkpoint_path=str(work / "ck.sqlite"), embedder="hash:64", concurrency=1),
                            options={"n_per_type": 1, "rounds": 6})
    ds = load_dataset("rolememo", out / "1k") if (out / "1k").exists() else load_dataset("rolememo", next(p for p in out.iterdir() if p.is_dir()))
    train = [i for i in ds.items if i.dialogue.persona.id == "mara"]
    held = [i for i in ds.items if i.dialogue.persona.id != "mara"]
    from dualmem.schema import Dataset

    return Dataset(name="train", items=train), Dataset(name="heldout", items=held)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/grpo_tiny_cpu.json")
    ap.add_argument("--sft-steps", type=int, default=120)
    ap.add_argument("--grpo-steps", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-rollouts", type=int, default=8)
    ap.add_argument("--chunk-tokens", type=int, default=400)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--init", default="", help="start GRPO from this saved SFT output (its sft/ folder); skips the SFT")
    ap.add_argument("--keep", default="", help="copy the SFT output (model and tokenizer) to this folder")
    args = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from fixtures.tiny_model import tiny_llama, tiny_tokenizer
    from transformers import TrainerCallback

    from dualmem.testing import HashEmbeddings
    from dualmem.training.episode import build_episode, gold_steps
    from dualmem.training.export import gold_records, write_jsonl
    from dualmem.training.grpo_trl import EpisodeRunner, GRPORunConfig, build_trainer
    from dualmem.training.sft import SFTRunConfig, train_sft

    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
    t0 = time.time()
    train, held = make_data(work)
    episodes = [build_episode(i, chunk_tokens=args.chunk_tokens) for i in [*train.items, *held.items]]
    texts = [m["content"] for e in episodes for s in gold_steps(e) for m in e.messages(s.view, s.chunk)]
    texts += [s.target.model_dump_json() for e in episodes for s in gold_steps(e)]
    if args.init:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok, model = AutoTokenizer.from_pretrained(args.init), AutoModelForCausalLM.from_pretrained(args.init)
    else:
        tok = tiny_tokenizer(texts)
        model = tiny_llama(tok)
    embed = HashEmbeddings(64)
    cfg = GRPORunConfig(
        output_dir=str(work / "grpo"), num_generations=4, max_completion_length=96, chunk_tokens=args.chunk_tokens,
        max_steps=args.grpo_steps, learning_rate=args.lr, beta=0.0, use_cpu=True, disable_tqdm=True, embedder="hash:64",
        save_steps=10_000, logging_steps=1, temperature=1.0,
    )
    held_eps = [build_episode(i, chunk_tokens=args.chunk_tokens) for i in held.items]
    evaluator = EpisodeRunner(held_eps, cfg, embed=embed)

    def held_out() -> dict[str, float]:
        model.eval()
        trajs = [t for e in held_eps for t in evaluator.play(e, model, tok, args.eval_rollouts)]
        model.train()
        m = [t.metrics() for t in trajs]
        return {k: round(mean(x[k] for x in m), 4) for k in ("score", "parsed_share", "similarity", "fact_recall", "insight_recall")}

    curve = [{"phase": "SFT model (--init)" if args.init else "random init", "step": 0, **held_out()}]
    records = gold_records(train, chunk_tokens=args.chunk_tokens, keep_empty=1.0)
    write_jsonl(work / "sft.jsonl", records)
    sft = SFTRunConfig(train_file=str(work / "sft.jsonl"), output_dir=str(work / "sft"), learning_rate=3e-3, lr_scheduler_type="constant",
                       warmup_ratio=0.0, per_device_train_batch_size=4, gradient_accumulation_steps=1, max_steps=args.sft_steps,
                       max_length=2048, logging_steps=10, save_steps=10_000, use_cpu=True, disable_tqdm=True)
    t_sft = time.time()
    sft_out = {"train_loss": float("nan")} if args.init else train_sft(sft, model=model, tokenizer=tok)
    sft_seconds = time.time() - t_sft
    if args.keep and not args.init:
        import shutil

        tok.save_pretrained(work / "sft")
        shutil.copytree(work / "sft", args.keep, dirs_exist_ok=True)
    if not args.init:
        curve.append({"phase": "after SFT", "step": 0, **held_out()})
    print(json.dumps(curve[-2:]), flush=True)

    class Eval(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):  # noqa: ANN001, ANN003
            if state.global_step % args.eval_every == 0:
                curve.append({"phase": "GRPO", "step": state.global_step, **held_out()})
                print(json.dumps(curve[-1]), flush=True)

    trainer = build_trainer(cfg, dataset=train, model=model, tokenizer=tok, embed=embed)
    trainer.add_callback(Eval())
    t_grpo = time.time()
    trainer.train()
    grpo_seconds = time.time() - t_grpo
    train_logs = [{k: round(v, 4) for k, v in h.items() if k in ("step", "reward", "reward_std", "loss")} for h in trainer.state.log_history if "reward" in h]
    result = {
        "what": "held-out episode reward of a tiny random Llama: random init, after SFT on gold, then every few GRPO steps (TRL, CPU)",
        "command": "nice -n 19 python " + " ".join(sys.argv),
        "train_history": [i.dialogue.id for i in train.items], "heldout_history": [i.dialogue.id for i in held.items],
        "settings": {k: getattr(args, k) for k in vars(args)},
        "heldout_curve": curve, "grpo_train_log": train_logs,
        "sft_final_loss": round(sft_out["train_loss"], 4),
        "seconds": {"sft": round(sft_seconds, 1), "grpo": round(grpo_seconds, 1), "total": round(time.time() - t0, 1)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"curve": [(c["phase"], c["step"], c["score"]) for c in curve], "seconds": result["seconds"]}))


if __name__ == "__main__":
    main()
