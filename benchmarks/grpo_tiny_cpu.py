"""A small CPU GRPO run (TRL) of the writer on a tiny random Llama: does the held-out reward rise over the steps?

Data: RoleMemo histories generated offline by the scripted weave model (``fake:weave``). Training: the persona
``mara`` and ``--train-personas - 1`` renamed copies of it (same persona text, another name, so other scripted
fragments and histories); held out: ``chen-wei``, a different persona whose history is never trained on (the
tokenizer is trained on the training data only). The tiny model (2 layers, 32 wide, byte-level BPE) starts from
random weights, gets a short SFT warm start on gold targets (``--sft-steps``; few steps on purpose, so that part of
its turns still fail to parse and there is room to improve), then GRPO with the dense reward. One GRPO step is
``--turns-per-step`` writing turns of one episode group (``--num-generations`` rollouts); when it equals the
episode's chunks (the default) every step trains one whole, freshly played episode group, on-policy.

The held-out reward is the mean episode reward of ``--eval-rollouts`` sampled rollouts of the held-out history,
measured every ``--eval-every`` steps with common random numbers: torch is re-seeded with ``--eval-seed`` before
each evaluation (and the training RNG restored after), so the curve compares models, not dice. Confidence: at the
end the initial (after SFT) and final models are evaluated at ``--check-seeds`` other seeds; the spread of the
initial model's scores over seeds is the noise of one evaluation, and the per-seed differences final - initial
are a paired comparison.

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
from statistics import mean, pstdev

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout first; the tiny model fixture
HELD_OUT = "chen-wei"
NAMES = [
    "Ines Duarte",
    "Kofi Mensah",
    "Lena Brandt",
    "Ravi Iyer",
    "Sofia Marin",
    "Tomas Novak",
    "Yuki Sato",
    "Omar Haddad",
    "Greta Lund",
    "Pablo Reyes",
    "Hana Kim",
]


def make_data(work: Path, train_personas: int, length: int) -> tuple[object, object]:
    from dualmem.config import Settings
    from dualmem.datasets import load_dataset
    from dualmem.generate import generate_rolememo
    from dualmem.schema import Dataset
    from dualmem.testing import HashEmbeddings

    fixtures = REPO / "tests" / "fixtures" / "personas"
    folder = work / "personas"
    folder.mkdir(parents=True)
    mara = json.loads((fixtures / "mara.json").read_text())
    (folder / "mara.json").write_text(json.dumps(mara))
    (folder / f"{HELD_OUT}.json").write_text((fixtures / "chen.json").read_text())
    for name in NAMES[: train_personas - 1]:
        (folder / f"{name.split()[0].lower()}.json").write_text(json.dumps({**mara, "name": name}))
    out = generate_rolememo(
        folder,
        work / "data",
        lengths=(length,),
        model="fake:weave",
        embeddings=HashEmbeddings(64),
        settings=Settings(checkpoint_path=str(work / "ck.sqlite"), embedder="hash:64", concurrency=1),
        options={"n_per_type": 1, "rounds": 6},
    )
    ds = load_dataset("rolememo", next(p for p in out.iterdir() if p.is_dir()))
    train = [i for i in ds.items if i.dialogue.persona.id != HELD_OUT]
    held = [i for i in ds.items if i.dialogue.persona.id == HELD_OUT]
    assert held and len(train) == train_personas, (len(held), len(train))
    return Dataset(name="train", items=train), Dataset(name="heldout", items=held)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/grpo_tiny_cpu.json")
    ap.add_argument("--train-personas", type=int, default=8, help="training histories: mara and renamed copies")
    ap.add_argument("--length", type=int, default=1500, help="history length in tokens (scripted generator)")
    ap.add_argument("--sft-steps", type=int, default=110)
    ap.add_argument("--grpo-steps", type=int, default=48)
    ap.add_argument("--turns-per-step", type=int, default=0, help="writing turns per GRPO step (0: a whole episode)")
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument(
        "--grpo-seed",
        type=int,
        default=42,
        help="seed of the GRPO trainer (its rollouts); the SFT start stays the same",
    )
    ap.add_argument("--eval-every", type=int, default=8)
    ap.add_argument("--eval-rollouts", type=int, default=32)
    ap.add_argument("--eval-seed", type=int, default=1234)
    ap.add_argument(
        "--check-seeds", type=int, default=3, help="extra seeds at which the initial and final models are compared"
    )
    ap.add_argument("--chunk-tokens", type=int, default=400)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument(
        "--placebo",
        action="store_true",
        help="control: permute the episode rewards among a step's rollouts (no signal)",
    )
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
    from dualmem.training.writing import writer_context

    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
    t0, c0 = time.time(), time.process_time()
    train, held = make_data(work, args.train_personas, args.length)
    train_eps = [build_episode(i, chunk_tokens=args.chunk_tokens) for i in train.items]
    held_eps = [build_episode(i, chunk_tokens=args.chunk_tokens) for i in held.items]
    ctx = writer_context(
        embedder="hash:64", chunk_tokens=args.chunk_tokens
    )  # the rollouts' memory embedder (cfg.memory_embedder)
    steps = [s for e in train_eps for s in gold_steps(e, ctx)]
    texts = [m["content"] for s in steps for m in s.messages] + [s.target.model_dump_json() for s in steps]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.init:
        tok, model = AutoTokenizer.from_pretrained(args.init), AutoModelForCausalLM.from_pretrained(args.init)
    else:
        tok = tiny_tokenizer(texts)
        model = tiny_llama(tok)
    turns = args.turns_per_step or len(train_eps[0].chunks)
    embed = HashEmbeddings(64)
    cfg = GRPORunConfig(
        output_dir=str(work / "grpo"),
        num_generations=args.num_generations,
        episodes_per_step=turns,
        max_completion_length=96,
        chunk_tokens=args.chunk_tokens,
        max_steps=args.grpo_steps,
        learning_rate=args.lr,
        beta=0.0,
        use_cpu=True,
        disable_tqdm=True,
        embedder="hash:64",
        memory_embedder="hash:64",
        save_steps=10_000,
        logging_steps=1,
        temperature=1.0,
        seed=args.grpo_seed,
    )
    evaluator = EpisodeRunner(held_eps, cfg, embed=embed)
    keys = ("score", "parsed_share", "similarity", "fact_recall", "insight_recall")

    def held_out(policy: object = None, seed: int = args.eval_seed) -> dict[str, float]:
        policy = policy or model
        rng = torch.get_rng_state()
        torch.manual_seed(seed)  # common random numbers: every model is evaluated with the same dice
        policy.eval()
        trajs = [t for e in held_eps for t in evaluator.play(e, policy, tok, args.eval_rollouts)]
        policy.train()
        torch.set_rng_state(rng)
        m = [t.metrics() for t in trajs]
        out = {k: round(mean(x[k] for x in m), 4) for k in keys}
        return {**out, "score_se": round(pstdev(x["score"] for x in m) / len(m) ** 0.5, 4)}

    curve = [{"phase": "SFT model (--init)" if args.init else "random init", "step": 0, **held_out()}]
    records = gold_records(train, keep_empty=1.0, ctx=ctx)
    write_jsonl(work / "sft.jsonl", records)
    sft = SFTRunConfig(
        train_file=str(work / "sft.jsonl"),
        output_dir=str(work / "sft"),
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
    t_sft = time.time()
    sft_out = (
        {"train_loss": float("nan")} if args.init or not args.sft_steps else train_sft(sft, model=model, tokenizer=tok)
    )
    sft_seconds = time.time() - t_sft
    if args.keep and not args.init:
        import shutil

        model.save_pretrained(work / "sft")
        tok.save_pretrained(work / "sft")
        shutil.copytree(work / "sft", args.keep, dirs_exist_ok=True)
    if not args.init:
        curve.append({"phase": "after SFT", "step": 0, **held_out()})
    print(json.dumps(curve[-1]), flush=True)
    model.save_pretrained(
        work / "start"
    )  # the GRPO start, for the paired check (a deepcopy kept evaluating the trained model)

    class Eval(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if state.global_step % args.eval_every == 0:
                curve.append({"phase": "GRPO", "step": state.global_step, **held_out()})
                print(json.dumps(curve[-1]), flush=True)

    trainer = build_trainer(cfg, dataset=train, model=model, tokenizer=tok, embed=embed)
    trainer.add_callback(Eval())
    # rows are turn-major with the G rollouts contiguous; one permutation per step gives rollout g another rollout's reward
    if args.placebo:
        import random

        dice, g = random.Random(args.eval_seed), args.num_generations

        def placebo(completions: list, episode_reward: list[float], **kw: object) -> list[float]:
            perm = dice.sample(range(g), g)
            return [episode_reward[i - i % g + perm[i % g]] for i in range(len(episode_reward))]

        trainer.reward_funcs[0] = placebo
    t_grpo = time.time()
    trainer.train()
    grpo_seconds = time.time() - t_grpo
    initial = AutoModelForCausalLM.from_pretrained(work / "start")
    seeds = [args.eval_seed + 1 + n for n in range(args.check_seeds)]
    pairs = [(s, held_out(initial, s), held_out(model, s)) for s in seeds]
    last = curve[-1]
    start = next(c for c in curve if c["phase"] in ("after SFT", "SFT model (--init)"))
    replay = held_out(initial)["score"]  # the restored start model at the curve's seed must reproduce the curve's start
    diffs = [round(b["score"] - a["score"], 4) for _, a, b in pairs]
    init_scores = [start["score"]] + [a["score"] for _, a, _ in pairs]
    check = {
        "seeds": seeds,
        "initial": [{"seed": s, **a} for s, a, _ in pairs],
        "final": [{"seed": s, **b} for s, _, b in pairs],
        "final_minus_initial": diffs,
        "mean_gain": round(mean(diffs), 4) if diffs else None,
        "noise_initial_range": round(max(init_scores) - min(init_scores), 4),
        "noise_initial_sd": round(pstdev(init_scores), 4),
        "curve_gain": round(last["score"] - start["score"], 4),
        "start_replayed": replay == start["score"],
    }
    print(json.dumps(check), flush=True)
    train_logs = [
        {k: round(v, 4) for k, v in h.items() if k in ("step", "reward", "reward_std", "loss", "grad_norm")}
        for h in trainer.state.log_history
        if "reward" in h
    ]
    result = {
        "what": "held-out episode reward of a tiny random Llama: random init, after SFT on gold, then every few GRPO steps (TRL, CPU)",
        "command": "nice -n 19 python " + " ".join(sys.argv),
        "train_history": [i.dialogue.id for i in train.items],
        "heldout_history": [i.dialogue.id for i in held.items],
        "settings": {
            **{k: getattr(args, k) for k in vars(args)},
            "turns_per_step_used": turns,
            "chunks_per_episode": len(train_eps[0].chunks),
            "heldout_chunks": len(held_eps[0].chunks),
            "max_completion_length": cfg.max_completion_length,
            "beta": cfg.beta,
            "temperature": cfg.temperature,
            "grpo_lr_scheduler": str(trainer.args.lr_scheduler_type),
            "sft_lr": sft.learning_rate,
            "sft_batch": sft.per_device_train_batch_size,
        },
        "heldout_curve": curve,
        "paired_check": check,
        "grpo_train_log": train_logs,
        "sft_final_loss": round(sft_out["train_loss"], 4),
        "seconds": {
            "sft": round(sft_seconds, 1),
            "grpo_incl_evals": round(grpo_seconds, 1),
            "total": round(time.time() - t0, 1),
            "cpu_total": round(time.process_time() - c0, 1),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {
                "curve": [(c["phase"], c["step"], c["score"], c["parsed_share"]) for c in curve],
                "seconds": result["seconds"],
            }
        )
    )


if __name__ == "__main__":
    main()
