"""LoCoMo evidence recall@10 without any LLM: ``raw-turns`` and the best LLM-free ranker.

Every conversation of ``locomo10.json`` is stored whole, then each question of
categories 1–4 retrieves 10 turns; its score is the fraction of its gold
evidence dialogue ids (``D1:3``) among them
(:func:`dualmem.evals.metrics.locomo_evidence_recall`). Reported per category
and overall (mean over questions), per conversation too. Questions whose
evidence names no turn are skipped (counted in ``skipped_no_evidence``).

Variants:

- ``raw-turns`` — the :class:`~dualmem.frameworks.raw_turns.RawTurnsFramework`
  on a temporary LanceDB: every turn verbatim, dense retrieval.
- ``best`` — :class:`~dualmem.retrieval.turns.TurnIndex`: dense (question without the speakers' names) + BM25 over
  ``speaker: text`` + 3-turn windows (dense and BM25) + adjacent-turn and session smoothing + a bonus for turns
  of the person the question names. The evidence and observation fields are
  never used for retrieval; the weights were tuned on these same 10
  conversations (there is no held-out split).
- ``best-ft`` — ``best`` with question vectors from a fine-tuned copy of the
  bundled embedder (:mod:`dualmem.retrieval.query_encoder`), leave one
  conversation out: for each conversation the query encoder is trained on the
  other nine conversations' questions and evidence turns (their frozen turn
  vectors; nothing is re-embedded) and never sees the one it is scored on. The
  turn vectors and ranker weights are ``best``'s. Ten fine-tunings: about 8
  minutes on 2 cores.

Run: ``python benchmarks/locomo_retrieval.py [--data ../shared/data/locomo/locomo10.json]``
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dualmem.config import Settings  # noqa: E402
from dualmem.datasets import load_locomo  # noqa: E402
from dualmem.datasets._validate import write_json_atomic  # noqa: E402
from dualmem.evals.metrics import locomo_evidence_recall, mean  # noqa: E402
from dualmem.frameworks import FrameworkContext  # noqa: E402
from dualmem.frameworks.raw_turns import RawTurnsFramework  # noqa: E402
from dualmem.models import BUNDLED_EMBEDDER, load_embeddings  # noqa: E402
from dualmem.retrieval.cache import DEFAULT_FOLDER, CachedEmbeddings, EmbeddingCache  # noqa: E402
from dualmem.retrieval.query_encoder import (  # noqa: E402
    QueryEncoderConfig,
    QueryGroup,
    encode_queries,
    finetune_query_encoder,
)
from dualmem.retrieval.turns import TurnIndex, TurnRankConfig, dense_question  # noqa: E402
from dualmem.schema import DatasetItem, Query, Turn  # noqa: E402

DATA = REPO / ".." / "shared" / "data" / "locomo" / "locomo10.json"
OUT = REPO / "benchmarks" / "results" / "locomo_retrieval.json"
CATEGORIES = ("1", "2", "3", "4")
CATEGORY_NAMES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}
K = 10


def _questions(item: DatasetItem) -> list[Query]:
    return [q for q in item.queries if q.category in CATEGORIES and q.gold.turn_ids]


def _turns(item: DatasetItem) -> list[tuple[Turn, str]]:
    """Every turn of a conversation with its session id, in order."""
    return [(t, s.id) for s in item.dialogue.sessions for t in s.turns]


def run_raw_turns(item: DatasetItem, embeddings: CachedEmbeddings, workdir: Path) -> list[tuple[str, float]]:
    """Ingest one conversation into raw-turns (dense); return (category, recall@10) per question."""
    settings = Settings(store_uri=str(workdir / item.dialogue.id), search_mode="vector", embedder=BUNDLED_EMBEDDER)
    fw = RawTurnsFramework(FrameworkContext(namespace=(item.dialogue.id, "user"), settings=settings, embeddings=embeddings))
    for session in item.dialogue.sessions:
        fw.ingest(session)
    out = []
    for q in tqdm(_questions(item), desc=f"raw-turns {item.dialogue.id}", leave=False):
        hits = fw.retrieve(q.text, k=K)
        out.append((q.category or "", locomo_evidence_recall([h.id or "" for h in hits], q.gold.turn_ids, K)))
    return out


def _dense_questions(item: DatasetItem) -> list[str]:
    """The questions as they are embedded: without the speakers' names."""
    speakers = sorted({t.speaker for s in item.dialogue.sessions for t in s.turns if t.speaker})
    return [dense_question(q.text, speakers) for q in _questions(item)]


def run_best(
    item: DatasetItem, cache: EmbeddingCache, config: TurnRankConfig, question_vectors: np.ndarray | None = None
) -> list[tuple[str, float]]:
    """Rank one conversation's turns with the LLM-free ranker; return (category, recall@10) per question.

    ``question_vectors`` replaces the bundled embedder's vectors of the questions (a fine-tuned query encoder).
    """
    turns = _turns(item)
    index = TurnIndex(
        [t.id for t, _ in turns],
        [sid for _, sid in turns],
        [f"{t.speaker}: {t.text}" for t, _ in turns],
        cache.embed([t.text for t, _ in turns]),
        config,
        speakers=[t.speaker for t, _ in turns],
    )
    questions = _questions(item)
    vectors = cache.embed(_dense_questions(item)) if question_vectors is None else question_vectors
    out = []
    for q, qv in zip(questions, vectors, strict=True):
        ranked = [tid for tid, _ in index.rank(q.text, qv, k=K)]
        out.append((q.category or "", locomo_evidence_recall(ranked, q.gold.turn_ids, K)))
    return out


def run_best_finetuned(
    items: list[DatasetItem], cache: EmbeddingCache, config: TurnRankConfig, ft_config: QueryEncoderConfig
) -> dict[str, list[tuple[str, float]]]:
    """``best`` with a query encoder fine-tuned leave-one-conversation-out: each conversation is ranked
    with question vectors from a copy of the embedder trained on the other conversations' questions
    against their frozen turn vectors (:mod:`dualmem.retrieval.query_encoder`)."""
    from sentence_transformers import SentenceTransformer

    groups = {}
    for item in items:
        turns = [t for t, _ in _turns(item)]
        pos = {t.id: i for i, t in enumerate(turns)}
        groups[item.dialogue.id] = QueryGroup(
            cache.embed([t.text for t in turns]),
            _dense_questions(item),
            [[pos[g] for g in q.gold.turn_ids if g in pos] for q in _questions(item)],
        )
    path = getattr(cache.embeddings, "path", None)
    if path is None:
        raise SystemExit("best-ft fine-tunes a sentence-transformers model: give --embedder a local model folder")
    model = SentenceTransformer(str(path), device="cpu")
    start = copy.deepcopy(model.state_dict())
    out = {}
    for item in tqdm(items, desc="best-ft (leave one conversation out)"):
        held = item.dialogue.id
        model.load_state_dict(start)
        train = [g for cid, g in groups.items() if cid != held]
        finetune_query_encoder(model, train, ft_config, progress=f"fine-tune without {held}")
        out[held] = run_best(item, cache, config, encode_queries(model, groups[held].queries))
    return out


def _summary(per_conv: dict[str, list[tuple[str, float]]]) -> dict[str, Any]:
    rows = [r for rs in per_conv.values() for r in rs]
    by_cat = {
        f"{c} ({CATEGORY_NAMES[c]})": round(mean(v for cat, v in rows if cat == c), 4)
        for c in CATEGORIES
        if any(cat == c for cat, _ in rows)
    }
    return {
        "recall@10": round(mean(v for _, v in rows), 4),
        "by_category": by_cat,
        "n_questions": {c: sum(cat == c for cat, _ in rows) for c in CATEGORIES},
        "per_conversation": {cid: round(mean(v for _, v in rs), 4) for cid, rs in per_conv.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print its table and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="locomo10.json")
    parser.add_argument("--out", type=Path, default=OUT, help="JSON file written with the results")
    parser.add_argument("--variants", default="raw-turns,best,best-ft", help="comma-separated: raw-turns, best, best-ft")
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--config", default="{}", help="JSON overrides of TurnRankConfig (experiments)")
    parser.add_argument("--cache", type=Path, default=REPO / DEFAULT_FOLDER, help="embedding cache folder")
    parser.add_argument(
        "--embedder",
        default=BUNDLED_EMBEDDER,
        help="embedder spec (a local sentence-transformers folder, ...); results of another embedder than the "
        "bundled one go to <out stem>.<embedder folder name>.json",
    )
    args = parser.parse_args(argv)
    if not args.data.exists():
        raise SystemExit(f"LoCoMo data not found at {args.data}; pass --data (see ../shared/data/README.md)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    config = TurnRankConfig(**json.loads(args.config))

    started = time.perf_counter()
    dataset = load_locomo(args.data)
    items = dataset.items[: args.conversations] if args.conversations else dataset.items
    if "best-ft" in variants and len(items) < 2:
        raise SystemExit("best-ft trains on the other conversations: give --conversations 2 or more")
    cache = EmbeddingCache(load_embeddings(args.embedder), args.cache)
    if args.embedder != BUNDLED_EMBEDDER and args.out == OUT:
        args.out = OUT.with_name(f"{OUT.stem}.{Path(args.embedder).name}.json")
    cached_before = len(cache)
    t0 = time.perf_counter()
    texts = [t.text for it in items for s in it.dialogue.sessions for t in s.turns]
    questions = [q.text for it in items for q in _questions(it)] + [t for it in items for t in _dense_questions(it)]
    cache.embed(texts + questions, progress="embedding turns")
    embed_s = time.perf_counter() - t0
    skipped = sum(1 for it in items for q in it.queries if q.category in CATEGORIES and not q.gold.turn_ids)

    results: dict[str, Any] = {
        "benchmark": "locomo evidence recall@10 (LLM-free), categories 1-4",
        "embedder": args.embedder,
        "conversations": [it.dialogue.id for it in items],
        "skipped_no_evidence": skipped,
        "variants": {},
        "timing_s": {"embedding": round(embed_s, 1)},
        "embedding_cache": {"texts_before": cached_before, "embedded_now": cache.misses},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if "raw-turns" in variants:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="locomo-raw-turns-") as tmp:
            emb = CachedEmbeddings(cache)
            per = {it.dialogue.id: run_raw_turns(it, emb, Path(tmp)) for it in tqdm(items, desc="raw-turns")}
        results["variants"]["raw-turns"] = _summary(per) | {
            "description": "every turn verbatim in LanceDB (raw-turns framework), dense top-10 turns",
        }
        results["timing_s"]["raw-turns"] = round(time.perf_counter() - t0, 1)
    if "best" in variants:
        t0 = time.perf_counter()
        per = {it.dialogue.id: run_best(it, cache, config) for it in tqdm(items, desc="best")}
        results["variants"]["best"] = _summary(per) | {
            "description": "dense (question without speaker names) + BM25('speaker: text') + 3-turn window dense/BM25 + adjacent-turn and session smoothing + named-speaker bonus; "
            "weights tuned on these 10 conversations",
            "config": asdict(config),
        }
        results["timing_s"]["best"] = round(time.perf_counter() - t0, 1)
    if "best-ft" in variants:
        t0 = time.perf_counter()
        ft_config = QueryEncoderConfig()
        per = run_best_finetuned(items, cache, config, ft_config)
        results["variants"]["best-ft"] = _summary(per) | {
            "description": "best, with the question vectors from a copy of the bundled embedder fine-tuned on the "
            "other 9 conversations' questions against their frozen turn vectors (leave one conversation out: "
            "the encoder never saw the conversation it is scored on; the ranker weights are best's)",
            "config": asdict(config),
            "query_encoder": asdict(ft_config),
        }
        results["timing_s"]["best-ft"] = round(time.perf_counter() - t0, 1)
    results["timing_s"]["total"] = round(time.perf_counter() - started, 1)

    _print(results)
    if not args.conversations and args.config == "{}":
        print(f"wrote {write_json_atomic(args.out, results)}")
    return results


def _print(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"LoCoMo evidence recall@{K} over {len(results['conversations'])} conversations")
    table.add_column("metric")
    for name in results["variants"]:
        table.add_column(name, justify="right")
    names = list(next(iter(results["variants"].values()), {}).get("by_category", {}))
    for key in names:
        table.add_row(key, *[f"{r['by_category'].get(key, float('nan')):.4f}" for r in results["variants"].values()])
    table.add_row("overall", *[f"{r['recall@10']:.4f}" for r in results["variants"].values()])
    Console().print(table)
    print("timings (s):", results["timing_s"])


if __name__ == "__main__":
    main()
