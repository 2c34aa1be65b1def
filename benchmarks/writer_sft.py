"""Does a trained writer write better memory? LoRA SFT of the bundled SmolLM2-135M on RealMem gold, held out.

Every step is the product's own entry point:

1. ``dualmem train export-sft --realmem`` on the *training* personas (every RealMem
   persona except the held-out ones): memory points as fact targets, chunked as the
   writer chunks, insights out of the loss (RealMem has no gold insights).
2. ``dualmem train sft --model_name_or_path local:smollm2 --use_lora true`` (CPU).
3. ``dualmem eval -d realmem FILE -f dualmem --no-respond --limit L --personas P``
   on each *held-out* persona, once per writer: ``local:smollm2`` (zero-shot) and
   ``local:<adapter folder>`` (the SFT adapter), same settings otherwise
   (transformers engine, ``max_new_tokens``). Figures: session NDCG@10 and
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
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
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
    from dualmem.models import load_embeddings
    from dualmem.stores import DualStore
    from dualmem.writer.chunking import chunk_sessions

    item = next(it for it in load_dataset("realmem", DATA).items if it.dialogue.id == persona)
    sessions, _ = realmem_plan(item, limit)
    ingested = sessions[:-1]  # the last session is the one of the last query: replay stops before it
    settings = Settings()
    embed = load_embeddings(settings.embedder)
    store = DualStore.from_settings(Settings(store_uri=str(run_dir / "lancedb" / persona)), embeddings=embed)
    facts, insights = [], []
    for ns in store.namespaces():
        facts += [i.text for i in store.list(ns, kind="fact", limit=100_000)]
        insights += [i.text for i in store.list(ns, kind="insight", limit=100_000)]
    points = [p.content for s in ingested for p in s.memory_points]
    chunks = len(chunk_sessions(ingested, ("p",), settings.chunk_tokens))
    rec = memory_point_recall(points, facts, embed)["memory_point_recall"] if facts and points else 0.0
    return {"gold_points": len(points), "chunks": chunks, "facts": len(facts), "insights": len(insights),
            "point_coverage": rec, "facts_per_chunk": len(facts) / max(chunks, 1), "insights_per_chunk": len(insights) / max(chunks, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "writer_sft"))
    ap.add_argument("--held-out", default="Kenta_Tanaka,Adeleke_Okonjo", help="personas evaluated (never trained on)")
    ap.add_argument("--max-chunks", type=int, default=24, help="training chunks per training persona")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=2560)
    ap.add_argument("--limit", type=int, default=3, help="queries per held-out persona (replay stops before the last one's session)")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--adapter", default="", help="skip training: evaluate this adapter folder")
    ap.add_argument("--arms", default="zero-shot,sft", help="writers to evaluate; arms of an earlier result file are kept")
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
    result: dict = {"held_out": held, "train_personas": [f.name.split("_dialogues")[0] for f in train_files], "args": vars(args)}

    adapter = args.adapter
    if not adapter:
        export = ["dualmem", "train", "export-sft", "--out", str(out / "sft_data"), "--eval-ratio", "0", "--max-chunks", str(args.max_chunks)]
        for f in train_files:
            export += ["--realmem", str(f)]
        result["export_cpu_s"] = run([str(BIN), *export[1:]], out / "export.log")
        result["export_report"] = json.loads((out / "sft_data" / "export_report.json").read_text())
        adapter = str(out / "adapter")
        sft = [str(BIN), "train", "sft", "--model_name_or_path", "local:smollm2", "--train_file", str(out / "sft_data" / "train.jsonl"),
               "--output_dir", adapter, "--use_lora", "true", "--lora_r", str(args.lora_r), "--lora_alpha", str(2 * args.lora_r),
               "--learning_rate", str(args.lr), "--max_steps", str(args.steps), "--gradient_accumulation_steps", "1",
               "--max_length", str(args.max_length), "--use_cpu", "true", "--logging_steps", "10", "--save_steps", "100000",
               "--warmup_ratio", "0.05", "--disable_tqdm", "true"]
        t = time.time()
        result["sft_cpu_s"] = run(sft, out / "sft.log")
        result["sft_wall_s"] = time.time() - t
        result["sft_log"] = [ln for ln in (out / "sft.log").read_text().splitlines() if "'loss'" in ln or "train loss" in ln][-12:]
    arms = {"zero-shot": "local:smollm2", "sft": f"local:{Path(adapter).resolve()}"}
    arms = {k: v for k, v in arms.items() if k in args.arms.split(",")}
    earlier = json.loads(Path(args.result).read_text()) if Path(args.result).exists() else {}
    if args.adapter and earlier:  # evaluating an adapter trained by an earlier run: keep that run's training record
        result = {**earlier, **{k: v for k, v in result.items() if k != "args"}, "eval_args": vars(args)}
    result["arms"] = {k: v for k, v in earlier.get("arms", {}).items() if k not in arms}
    for arm, writer in arms.items():
        result["arms"][arm] = {"writer": writer, "personas": {}}
        for persona in held:
            f = next(f for f in files if f.name.startswith(persona + "_dialogues"))
            run_dir = out / "eval" / arm / persona
            if run_dir.exists():  # a fresh evaluation (dualmem eval would continue the earlier run)
                import shutil

                shutil.rmtree(run_dir)
            cmd = [str(BIN), "eval", "-d", "realmem", str(f), "-f", "dualmem", "--no-respond", "--limit", str(args.limit), "--personas", persona,
                   "--out", str(run_dir), "--set", f"writer_model={writer}", "--set", "local_engine=transformers",
                   "--set", f"max_new_tokens={args.max_new_tokens}"]
            t = time.time()
            cpu = run(cmd, out / f"eval-{arm}-{persona}.log")
            summary = json.loads((run_dir / "summary.json").read_text())
            row = {k: summary["overall"].get(k) for k in ("ndcg_any@10", "recall_any@10", "memory_point_recall")}
            row.update(n_queries=summary["n_queries"], failed_chunks=summary["ingest"]["failed_chunks"], wall_s=time.time() - t, cpu_s=cpu)
            row.update(coverage(run_dir, persona, args.limit))
            result["arms"][arm]["personas"][persona] = row
            print(arm, persona, json.dumps(row), flush=True)
        rows = list(result["arms"][arm]["personas"].values())
        keys = ("ndcg_any@10", "memory_point_recall", "point_coverage", "facts_per_chunk", "insights_per_chunk", "failed_chunks")
        result["arms"][arm]["macro"] = {k: sum(r[k] or 0 for r in rows) / len(rows) for k in keys}
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(result, indent=2))
    for arm, body in result["arms"].items():
        print(f"{arm:10s}", " ".join(f"{k}={v:.3f}" for k, v in body["macro"].items()))
    print("wrote", args.result)


if __name__ == "__main__":
    main()
