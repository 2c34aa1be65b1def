"""Does a trained writer write better memory? LoRA SFT of the bundled SmolLM2-135M on RealMem gold, held out.

Every step is the product's own entry point:

1. ``dualmem train export-sft --realmem`` on the *training* personas (every RealMem
   persona except the held-out ones): memory points as fact targets, chunked as the
   writer chunks, insights out of the loss (RealMem has no gold insights).
2. ``dualmem train sft --model_name_or_path local:smollm2 --use_lora true`` (CPU).
3. ``dualmem eval -d realmem FILE -f dualmem --no-respond --limit L --personas P``
   on each *held-out* persona, once per writer: ``local:smollm2`` (zero-shot) and
   ``local:<adapter folder>`` (the SFT adapter), same settings otherwise
   (the ``--engine``, transformers by default, and ``max_new_tokens``), and with the ``sft+grpo`` arm:
4. ``dualmem train rl --engine trl --data_format realmem`` on the same training personas:
   GRPO that goes on training the SFT adapter (LoRA, ``--use_lora true``), rollouts under
   the writer's grammar at the evaluation's ``max_new_tokens``, one-chunk episodes that
   start from the gold memory written before them (chunks past those SFT trained on, of the
   same training personas), dense reward = recall of the chunk's memory points by the facts
   written (insights not scored); its adapter is evaluated like
   the others (``local:<grpo folder>``); its training curve (reward, spread within each
   group of rollouts, seconds per step) goes into the result file.
   Figures: session NDCG@10 and
   memory-point recall@10 (RealMem's protocol, per query), and, read from the run's
   store, the share of the ingested sessions' gold memory points matched by a
   written fact (coverage), facts and insights per chunk, failed chunks, CPU time.

No persona of the evaluation is in the training data. Results: benchmarks/results/writer_sft.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "realmem"
BIN = Path(sys.executable).parent / "dualmem"


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd``; return its CPU seconds (children's user + system); fail loudly with the log's tail."""
    print("$", " ".join(cmd), flush=True)
    before = os.times()
    with log.open("w") as fh:
        done = subprocess.run(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    after = os.times()
    if done.returncode not in (0, 1):  # eval exits 1 when a chunk failed: that is a figure, not a crash
        sys.exit(f"{cmd[1]} failed ({done.returncode}):\n" + log.read_text()[-3000:])
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def coverage(run_dir: Path, persona: str, limit: int) -> dict[str, float]:
    """Return what the writer left in the run's store: gold-point coverage of facts, facts and insights per chunk."""
    from dualmem.config import Settings
    from dualmem.datasets import load_dataset
    from dualmem.evals.metrics import memory_point_recall
    from dualmem.evals.runners import realmem_plan
    from dualmem.memory.chunking import chunk_sessions
    from dualmem.models import load_embeddings
    from dualmem.stores import open_store

    item = next(it for it in load_dataset("realmem", DATA).items if it.dialogue.id == persona)
    sessions, _ = realmem_plan(item, limit)
    ingested = sessions[:-1]  # the last session is the one of the last query: replay stops before it
    settings = Settings()
    embed = load_embeddings(settings.embedder)
    store = open_store(Settings(store_uri=str(run_dir / "lancedb" / persona)), embeddings=embed)
    written = [
        i for ns in store.namespaces() for kind in ("fact", "insight") for i in store.list(ns, kind=kind, limit=100_000)
    ]
    facts = [i.text for i in written if i.kind == "fact"]
    insights = [i.text for i in written if i.kind == "insight"]
    points = [p.content for s in ingested for p in s.memory_points]
    chance = chance_ndcg(run_dir, written, [s.id for s in sessions])
    chunks = len(chunk_sessions(ingested, ("p",), settings.tuning.chunk_tokens))
    rec = memory_point_recall(points, facts, embed)["memory_point_recall"] if facts and points else 0.0
    fact_texts = {_norm(t) for t in facts}
    copies = sum(_norm(t) in fact_texts for t in insights)
    return {
        "gold_points": len(points),
        "chunks": chunks,
        "facts": len(facts),
        "insights": len(insights),
        "point_coverage": rec,
        "facts_per_chunk": len(facts) / max(chunks, 1),
        "insights_per_chunk": len(insights) / max(chunks, 1),
        "insight_copy_share": copies / len(insights) if insights else 0.0,
        "ndcg_chance": chance,
    }


def chance_ndcg(run_dir: Path, items: list, order: list[str], draws: int = 1000) -> float:
    """Return the mean, over the run's queries, of NDCG_any@10 when as many items as were retrieved are drawn at random
    from the memory written before the query (an insight also counts the sessions of the facts it cites, as retrieval does).

    With a small memory spread over many sessions, random items already hit the gold session often: this is the floor
    the writer's NDCG is read against. The memory is read from the final store (items the writer later rewrote count with
    their last source), and facts and insights are drawn as one pool (retrieval takes about half of each): a loose floor.
    """
    import random

    from dualmem.evals.metrics import realmem_session_metrics

    rng = random.Random(0)
    session_of = {i.id: i.source.session_id for i in items}
    sessions = [
        [s for s in dict.fromkeys([i.source.session_id, *(session_of.get(g) for g in i.grounding)]) if s] for i in items
    ]
    scores = []
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        gold = record["gold"].get("session_ids") or []
        seen = set(order[: record["ingested_sessions"]])
        pool = [ss for ss in sessions if ss and ss[0] in seen]
        n = min(len([r for r in record["retrieved"] if not r.get("expanded")]), len(pool))  # as runners score them
        if not gold:
            continue
        total = 0.0
        for _ in range(draws):
            ranked = [s for ss in rng.sample(pool, n) for s in ss]
            total += realmem_session_metrics(ranked, gold, ks=(10,)).get("ndcg_any@10", 0.0)
        scores.append(total / draws)
    return sum(scores) / len(scores) if scores else 0.0


def _norm(text: str) -> str:
    """Return ``text`` casefolded with everything but letters and digits dropped (an insight that repeats a fact matches it)."""
    return "".join(c for c in text.casefold() if c.isalnum())


def same_protocol(earlier: dict, args: argparse.Namespace, held: list[str], wanted: list[str]) -> None:
    """Exit unless the arms kept from ``earlier`` were evaluated with this run's held-out personas, limit and token budget."""
    kept = [a for a in earlier.get("arms", {}) if a not in wanted]
    before = earlier.get("eval_args") or earlier.get("args") or {}
    diff = [
        f"--{k.replace('_', '-')} {before[k]}"
        for k in ("held_out", "limit", "max_new_tokens", "engine")
        if k in before and str(before[k]) != str(getattr(args, k))
    ]
    if kept and diff:
        sys.exit(
            f"{args.result} holds arms ({', '.join(kept)}) measured with other settings: pass {' '.join(diff)}, or another --result"
        )
    if kept and earlier.get("held_out") != held:
        sys.exit(f"{args.result} holds arms measured on other held-out personas ({earlier.get('held_out')})")


def train_grpo(args: argparse.Namespace, adapter: str, train_files: list[Path], folder: Path, log: Path) -> dict:
    """Run GRPO from the SFT adapter on the training personas; return its settings, seconds and curve (per step and per group)."""
    if folder.exists():  # a fresh run (TRL would resume nothing, but the log file must be this run's)
        import shutil

        shutil.rmtree(folder)
    cmd = [str(BIN), "train", "rl", "--engine", "trl"]
    for f in train_files:
        cmd += ["--data", str(f)]
    skip = args.max_chunks if args.grpo_skip_chunks < 0 else args.grpo_skip_chunks
    cmd += [
        "--data_format",
        "realmem",
        "--episode_chunks",
        str(args.grpo_window),
        "--skip_chunks",
        str(skip),
        "--max_chunks",
        str(args.grpo_max_chunks),
        "--max_prompt_tokens",
        str(args.grpo_max_prompt_tokens),
        "--model_name_or_path",
        f"local:{Path(adapter).resolve()}",
        "--use_lora",
        "true",
        "--grammar",
        "true",
        "--num_generations",
        str(args.grpo_generations),
        "--episodes_per_step",
        str(args.grpo_window),
        "--max_completion_length",
        str(args.max_new_tokens),
        "--beta",
        "0",
        "--learning_rate",
        str(args.grpo_lr),
        "--max_steps",
        str(args.grpo_steps),
        "--temperature",
        "1.0",
        "--bf16",
        "true",
        "--use_cpu",
        "true",
        "--output_dir",
        str(folder),
        "--save_steps",
        "100000",
        "--logging_steps",
        "1",
        "--disable_tqdm",
        "true",
    ]
    t = time.time()
    cpu = run(cmd, log)
    wall = time.time() - t
    out = json.loads((folder / "dualmem_grpo_log.json").read_text())
    keys = (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rewards/fact_recall/mean",
        "loss",
        "grad_norm",
        "completions/mean_length",
        "entropy",
    )
    clock = {s["step"]: s for s in out["steps"]}
    curve = [
        {
            "step": h["step"],
            **{k: h.get(k) for k in keys},
            **{k: clock.get(h["step"], {}).get(k) for k in ("wall_s", "cpu_s")},
        }
        for h in out["log_history"]
        if "reward" in h
    ]
    return {
        "command": " ".join(cmd),
        "train_personas": [f.name.split("_dialogues")[0] for f in train_files],
        "cpu_s": cpu,
        "wall_s": wall,
        "curve": curve,
        "groups": [{k: v for k, v in g.items() if k != "texts"} for g in out["rollouts"]],
        "log": str(folder / "dualmem_grpo_log.json"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "writer_sft"))
    ap.add_argument("--held-out", default="Kenta_Tanaka,Adeleke_Okonjo", help="personas evaluated (never trained on)")
    ap.add_argument("--max-chunks", type=int, default=24, help="training chunks per training persona")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=2560)
    ap.add_argument(
        "--limit", type=int, default=3, help="queries per held-out persona (replay stops before the last one's session)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument(
        "--adapter", default="", help="skip training: evaluate this adapter folder (and start GRPO from it)"
    )
    ap.add_argument(
        "--arms",
        default="zero-shot,sft",
        help="writers to evaluate (zero-shot, sft, sft+grpo); arms of an earlier result file are kept",
    )
    ap.add_argument("--grpo-adapter", default="", help="skip GRPO training: evaluate this folder as the sft+grpo arm")
    ap.add_argument("--grpo-steps", type=int, default=12, help="GRPO optimizer steps (one episode group each)")
    ap.add_argument("--grpo-lr", type=float, default=2e-4)
    ap.add_argument("--grpo-generations", type=int, default=4, help="rollouts per group")
    ap.add_argument(
        "--grpo-window", type=int, default=1, help="chunks per GRPO episode (windows that hold memory points)"
    )
    ap.add_argument(
        "--grpo-max-prompt-tokens",
        type=int,
        default=2048,
        help="GRPO: leave out episodes with longer prompts (CPU time)",
    )
    ap.add_argument(
        "--grpo-skip-chunks",
        type=int,
        default=-1,
        help="GRPO episodes start past this chunk (-1: --max-chunks, the chunks SFT saw)",
    )
    ap.add_argument(
        "--grpo-max-chunks", type=int, default=72, help="GRPO episodes end before this chunk of each training history"
    )
    ap.add_argument(
        "--rescore",
        action="store_true",
        help="run nothing: read the arms' finished run folders (OUT/eval) again, keep their times",
    )
    ap.add_argument(
        "--train-only",
        action="store_true",
        help="train (SFT unless --adapter, GRPO for sft+grpo), evaluate nothing: OUT/train_only.json",
    )
    ap.add_argument(
        "--engine", default="transformers", choices=["transformers", "llama.cpp"], help="local engine of the writers"
    )
    ap.add_argument("--result", default=str(ROOT / "benchmarks" / "results" / "writer_sft.json"))
    args = ap.parse_args()
    if not DATA.exists():
        sys.exit(f"{DATA} is absent: this benchmark needs RealMem (see ../shared/data/README.md)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held = args.held_out.split(",")
    files = sorted(DATA.glob("*_dialogues_*.json"))
    train_files = [f for f in files if not any(f.name.startswith(h + "_dialogues") for h in held)]
    assert len(train_files) == len(files) - len(held), "a held-out persona has no RealMem file"
    result: dict = {
        "held_out": held,
        "train_personas": [f.name.split("_dialogues")[0] for f in train_files],
        "args": vars(args),
    }
    wanted = args.arms.split(",")
    unknown = set(wanted) - {"zero-shot", "sft", "sft+grpo"}
    if unknown:
        sys.exit(f"--arms: unknown arm(s) {', '.join(sorted(unknown))}; use zero-shot, sft, sft+grpo")
    earlier = json.loads(Path(args.result).read_text()) if Path(args.result).exists() else {}
    if not args.train_only:
        same_protocol(
            earlier, args, held, [] if args.rescore else wanted
        )  # --rescore: the arms read again must match too
    if args.rescore and (not args.adapter or ("sft+grpo" in wanted and not args.grpo_adapter)):
        sys.exit(
            "--rescore trains nothing: pass --adapter (and --grpo-adapter for sft+grpo), the folders that were evaluated"
        )

    adapter = args.adapter
    if adapter:  # the training flags (steps, lr, lora_r…) below in args were not used: say so beside them
        result["adapter_given"] = (
            f"{adapter}: not trained by this run; its training record is the result file of the run that trained it"
        )
    if not adapter:
        export = [
            "dualmem",
            "train",
            "export-sft",
            "--out",
            str(out / "sft_data"),
            "--eval-ratio",
            "0",
            "--max-chunks",
            str(args.max_chunks),
        ]
        for f in train_files:
            export += ["--realmem", str(f)]
        result["export_cpu_s"] = run([str(BIN), *export[1:]], out / "export.log")
        result["export_report"] = json.loads((out / "sft_data" / "export_report.json").read_text())
        adapter = str(out / "adapter")
        sft = [
            str(BIN),
            "train",
            "sft",
            "--model_name_or_path",
            "local:smollm2",
            "--train_file",
            str(out / "sft_data" / "train.jsonl"),
            "--output_dir",
            adapter,
            "--use_lora",
            "true",
            "--lora_r",
            str(args.lora_r),
            "--lora_alpha",
            str(2 * args.lora_r),
            "--learning_rate",
            str(args.lr),
            "--max_steps",
            str(args.steps),
            "--gradient_accumulation_steps",
            "1",
            "--max_length",
            str(args.max_length),
            "--use_cpu",
            "true",
            "--logging_steps",
            "10",
            "--save_steps",
            "100000",
            "--warmup_ratio",
            "0.05",
            "--disable_tqdm",
            "true",
        ]
        t = time.time()
        result["sft_cpu_s"] = run(sft, out / "sft.log")
        result["sft_wall_s"] = time.time() - t
        result["sft_log"] = [
            ln for ln in (out / "sft.log").read_text().splitlines() if "'loss'" in ln or "train loss" in ln
        ][-12:]
    grpo = args.grpo_adapter
    if "sft+grpo" in wanted and not grpo:
        grpo = str(out / "grpo")
        result["grpo"] = train_grpo(args, adapter, train_files, Path(grpo), out / "grpo.log")
    if args.train_only:
        (out / "train_only.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result.get("grpo", {}).get("curve"), indent=1), "\nwrote", out / "train_only.json")
        return
    arms = {
        "zero-shot": "local:smollm2",
        "sft": f"local:{Path(adapter).resolve()}",
        "sft+grpo": f"local:{Path(grpo).resolve()}" if grpo else "",
    }
    arms = {k: v for k, v in arms.items() if k in wanted}
    if args.adapter and earlier:  # evaluating an adapter trained by an earlier run: keep that run's training record
        result = {**earlier, **{k: v for k, v in result.items() if k != "args"}, "eval_args": vars(args)}
    result["arms"] = {k: v for k, v in earlier.get("arms", {}).items() if k not in arms}
    for arm, writer in arms.items():
        result["arms"][arm] = {"writer": writer, "personas": {}}
        for persona in held:
            f = next(f for f in files if f.name.startswith(persona + "_dialogues"))
            run_dir = out / "eval" / arm / persona
            before = earlier.get("arms", {}).get(arm, {}).get("personas", {}).get(persona, {})
            if (
                args.rescore
            ):  # the run folder's evaluation as it stands, its store read again; times from the result file
                if not (run_dir / "summary.json").exists() or not before:
                    sys.exit(
                        f"--rescore: no finished {arm} run of {persona} in {run_dir} and {args.result}; run without --rescore"
                    )
                if earlier["arms"][arm]["writer"] != writer:
                    sys.exit(
                        f"--rescore: {run_dir} was evaluated with {earlier['arms'][arm]['writer']}, not {writer}; pass that adapter"
                    )
                wall, cpu = before["wall_s"], before["cpu_s"]
            else:
                if run_dir.exists():  # a fresh evaluation (dualmem eval would continue the earlier run)
                    import shutil

                    shutil.rmtree(run_dir)
                cmd = [
                    str(BIN),
                    "eval",
                    "-d",
                    "realmem",
                    str(f),
                    "-f",
                    "dualmem",
                    "--no-respond",
                    "--limit",
                    str(args.limit),
                    "--personas",
                    persona,
                    "--out",
                    str(run_dir),
                    "--set",
                    f"writer_model={writer}",
                    "--set",
                    f"local_engine={args.engine}",
                    "--set",
                    f"max_new_tokens={args.max_new_tokens}",
                ]
                t = time.time()
                cpu = run(cmd, out / f"eval-{arm}-{persona}.log")
                wall = time.time() - t
            summary = json.loads((run_dir / "summary.json").read_text())
            row = {k: summary["overall"].get(k) for k in ("ndcg_any@10", "recall_any@10", "memory_point_recall")}
            row.update(
                n_queries=summary["n_queries"], failed_chunks=summary["ingest"]["failed_chunks"], wall_s=wall, cpu_s=cpu
            )
            row.update(coverage(run_dir, persona, args.limit))
            result["arms"][arm]["personas"][persona] = row
            print(arm, persona, json.dumps(row), flush=True)
        rows = list(result["arms"][arm]["personas"].values())
        keys = (
            "ndcg_any@10",
            "memory_point_recall",
            "point_coverage",
            "facts_per_chunk",
            "insights_per_chunk",
            "insight_copy_share",
            "ndcg_chance",
            "failed_chunks",
        )
        result["arms"][arm]["macro"] = {
            k: sum(r[k] or 0 for r in rows) / len(rows) for k in keys if all(k in r for r in rows)
        }
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(result, indent=2))
    for arm, body in result["arms"].items():
        print(f"{arm:10s}", " ".join(f"{k}={v:.3f}" for k, v in body["macro"].items()))
    print("wrote", args.result)


if __name__ == "__main__":
    main()
