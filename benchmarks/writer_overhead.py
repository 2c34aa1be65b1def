"""Writer overhead per chunk with an instant model: everything the writer does but the model call, on a real history.

``write_history`` (the product's entry point, default settings: chunks of 1,024
tokens, the bundled embedder, a LanceDB folder) over the first ``--sessions``
sessions of a RealMem persona, with a scripted writer that answers at once:
two facts from the chunk's user turns and an insight citing the first, and an
UPDATE of a view fact once the view shows three. A chunk's overhead is the
time from one model call's return to the next call's start: applying the
chunk's plan (ledger, lease, upsert) and drafting the next chunk's view and
prompt. Of that, the embedder's share (the bundled MiniLM embeds the chunk's
view query and the plan's new texts: two forward passes a chunk) is timed
apart, so what is left is DualMem's own work. Also the table commits per chunk (every table's versions) and the
files left per chunk. Runs against whichever DualMem is importable (the
benchmark of an earlier version runs the same way: ``PYTHONPATH=<its checkout>``).

    python benchmarks/writer_overhead.py --persona Sophie_Dubois --sessions 40
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "realmem"
RESULTS = REPO / "benchmarks" / "results" / "writer_overhead.json"
sys.path.insert(0, str(REPO / "benchmarks"))

from _lib.tables import table_versions  # noqa: E402
from _lib.timed_embeddings import TimedEmbeddings  # noqa: E402


def answer(messages: list[Any], tool: str | None = None) -> dict[str, Any]:
    """Answer a writer prompt at once: facts from the chunk's user turns, an insight, an UPDATE of a view fact."""
    text = str(messages[-1].content)
    view = text.split("## WORKING MEMORY", 1)[-1].split("## CONVERSATION CHUNK", 1)[0]
    chunk = text.split("## CONVERSATION CHUNK", 1)[-1]
    turns = re.findall(r'^\[([^\]]+)\] [^:"]*?: "(.*)"$', chunk, re.M)
    facts = [
        {"op": "ADD", "id": f"N{i + 1}", "text": f"The user said: {said[:120]}", "turn_ids": [tid]}
        for i, (tid, said) in enumerate(turns[:2])
    ]
    insights = (
        [{"op": "ADD", "id": "M1", "text": f"I read this as a sign: {turns[0][1][:80]}", "fact_ids": ["N1"]}]
        if turns
        else []
    )
    shown = re.findall(r"^(F\d+)", view, re.M)
    if len(shown) >= 3:
        facts.append(
            {
                "op": "UPDATE",
                "id": shown[len(chunk) % len(shown)],
                "text": f"Updated: {turns[-1][1][:80]}" if turns else "Updated",
                "turn_ids": [],
            }
        )
    return {"facts": facts, "insights": insights}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--persona", default="Sophie_Dubois")
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()

    import dualmem
    from dualmem.datasets import load_dataset
    from dualmem.testing import FakeChatModel

    try:  # this version's entry points, else an earlier version's
        from dualmem.stores import open_store
        from dualmem.writer import write_history
    except ImportError:
        from dualmem.writer.graph import write_history  # type: ignore[no-redef]

        from dualmem.stores import DualStore

        open_store = DualStore.from_settings  # type: ignore[assignment]
    from dualmem.config import Settings

    path = Path(args.data) / f"{args.persona}_dialogues_256k.json"
    if not path.exists():
        raise SystemExit(f"{path} not found: the benchmark needs the RealMem personas of ../shared/data")
    item = load_dataset("realmem", path).items[0]
    dialogue = item.dialogue.model_copy(update={"sessions": item.dialogue.sessions[: args.sessions]})
    calls: list[tuple[float, float]] = []

    def timed(messages: list[Any], tool: str | None = None) -> dict[str, Any]:
        start = time.perf_counter()
        out = answer(messages, tool)
        calls.append((start, time.perf_counter()))
        return out

    with tempfile.TemporaryDirectory(prefix="writer-overhead-") as tmp:
        settings = Settings(store_uri=f"{tmp}/db", checkpoint_path=f"{tmp}/checkpoints.sqlite")
        try:
            from dualmem.models import load_embeddings

            timed_emb: TimedEmbeddings | None = TimedEmbeddings(load_embeddings(settings.embedder, settings))
            store = open_store(settings, timed_emb)
        except (ImportError, TypeError):  # an earlier version: no embedder split
            timed_emb, store = None, open_store(settings)
        store.embeddings.embed_query("warm up the embedder")
        db = Path(tmp) / "db"
        versions = lambda: table_versions(store._db)  # noqa: E731
        before, files_before = versions(), sum(len(f) for _, _, f in os.walk(db))
        started = time.perf_counter()
        report = write_history(
            dialogue,
            dialogue.persona,
            settings=settings,
            model=FakeChatModel(responses=[timed], cycle=True),
            store=store,
            progress=False,
        )
        wall = time.perf_counter() - started
        spans = [(a[1], b[0]) for a, b in zip(calls, calls[1:], strict=False)]
        gaps = [(b - a) * 1000 for a, b in spans]
        embedding = timed_emb.within(spans) if timed_emb else []
        own = sorted(g - e for g, e in zip(gaps, embedding, strict=True))
        items = store.count((dialogue.persona.id, dialogue.user_id), status=None)  # type: ignore[union-attr]
        after = versions()
        commits = {t: after[t] - before.get(t, 0) for t in after}
        files = sum(len(f) for _, _, f in os.walk(db)) - files_before
    gaps.sort()
    result = {
        "benchmark": "writer overhead per chunk with an instant model (time between model calls), write_history defaults",
        "command": "python benchmarks/writer_overhead.py " + " ".join(sys.argv[1:]),
        "dualmem": getattr(dualmem, "__file__", ""),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "persona": args.persona,
        "sessions": args.sessions,
        "chunks": len(report.chunks),
        "model_calls": len(calls),
        "items_written": items,
        "wall_s": round(wall, 2),
        "commits_per_chunk": round(sum(commits.values()) / len(report.chunks), 2),
        "commits_by_table": commits,
        "files_per_chunk": round(files / len(report.chunks), 1),
        "per_chunk_ms": {
            "p50": round(statistics.median(gaps), 1),
            "p95": round(gaps[int(0.95 * (len(gaps) - 1))], 1),
            "mean": round(statistics.fmean(gaps), 1),
        },
        "embedder_ms_per_chunk_p50": round(statistics.median(embedding), 1) if embedding else None,
        "outside_embedder_ms_per_chunk": {
            "p50": round(statistics.median(own), 1),
            "p95": round(own[int(0.95 * (len(own) - 1))], 1),
        }
        if own
        else None,
        "target": {"per_chunk_p50_ms_max": 50.0, "commits_per_chunk_max": 2.0},
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
