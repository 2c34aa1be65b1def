"""Growth curves: how the writer's costs and a fresh reader's first search grow along one long history.

One long history, written by ``write_history`` (the product's entry point, default settings: chunks of 1,024
tokens, the bundled embedder, the default tidy cadence) with a scripted writer that answers at once (the one of
``writer_overhead.py``). The history is the RealMem personas' sessions one after the other (ids made unique,
repeated with new ids when more chunks are asked than they hold), written through the first persona. Along it:

- at chunks 10, 100 and 1,000 (``--marks``): the writer's overhead per chunk (time from one model call's return
  to the next call's start, median over the 10 chunks around the mark), table commits per chunk over those chunks
  (every table's version), and on object storage the requests per chunk (lines of the S3 server's request log);
- after 100, 1,000 (and 10,000) chunks (``--search-at``): a fresh worker's first search — a new process that
  opens the store and ranks one query with the product's ranking (``dualmem.retrieval.rank``), median of three
  processes, timed from opening the store to the answer (imports and the embedder's load not counted);
- at every mark: the store's bytes, files and the memory table's versions.

The embedder's share of the overhead (the bundled MiniLM: the chunk's view query and the plan's new texts) is
timed apart. A run of one place replaces that place's run in the results file and keeps the other's, each run
with its own command and date.

The same run on a local folder and on an S3-compatible server (moto's, loopback; ``--s3-chunks``). The writer is
paused while a mark is measured, so the measuring never overlaps a chunk.

    python benchmarks/growth.py --chunks 1000 --s3-chunks 300      # writes benchmarks/results/growth.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dualmem.testing.s3 import S3Server

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "realmem"
RESULTS = REPO / "benchmarks" / "results" / "growth.json"
sys.path.insert(0, str(REPO / "benchmarks"))

FRESH = """
import json, sys, time
import lancedb  # imports are not the search's time
from dualmem.config import Settings
from dualmem.models import load_embeddings
from dualmem.retrieval import rank
from dualmem.stores import open_store
settings = Settings(store_uri=sys.argv[1], store_options=json.loads(sys.argv[4]))
emb = load_embeddings(settings.embedder, settings)
emb.embed_query("warm up")
start = time.perf_counter()
store = open_store(settings, emb)
hits = rank(store, tuple(json.loads(sys.argv[2])), sys.argv[3], 10, settings=settings)
ms = (time.perf_counter() - start) * 1000
start = time.perf_counter()
emb.embed_query(sys.argv[3] + " again")
print(json.dumps({"ms": ms, "embed_ms": (time.perf_counter() - start) * 1000, "hits": len(hits)}))
"""


def history(chunks_wanted: int, data: Path) -> tuple[Any, list[Any]]:
    """Return (persona, sessions): the RealMem personas' sessions in a row, repeated with fresh ids as needed."""
    from dualmem.datasets import load_dataset

    files = sorted(data.glob("*_dialogues_256k.json"))
    if not files:
        raise SystemExit(f"no RealMem personas in {data}: the benchmark needs ../shared/data")
    files.insert(0, files.pop(next(i for i, f in enumerate(files) if f.name.startswith("Sophie"))))
    dialogues = [load_dataset("realmem", f).items[0].dialogue for f in files]
    sessions, rounds, tokens = [], 0, 0
    while tokens < chunks_wanted * 1024 * 1.1:
        for d in dialogues:
            for s in d.sessions:
                tag = f"r{rounds}-{d.persona.id}-{s.id}"
                turns = [t.model_copy(update={"id": f"{tag}-{t.id}"}) for t in s.turns]
                sessions.append(s.model_copy(update={"id": tag, "turns": turns}))
                tokens += sum(len(t.text) for t in s.turns) // 4
        rounds += 1
    return dialogues[0].persona, sessions


def _files(root: Path) -> tuple[int, int]:
    sizes = [f.stat().st_size for f in root.rglob("*") if f.is_file()]
    return len(sizes), sum(sizes)


class Place:
    """Where the store lives: a local folder, or a bucket on a loopback S3 server whose request log is counted."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.server = S3Server(tmp, "growth") if kind == "s3" else None
        self.uri = self.server.uri if self.server else str(tmp / "db")
        self.options: dict[str, str] = self.server.options if self.server else {}

    def requests(self) -> int:
        """Requests the S3 server has answered so far (0 for a local folder)."""
        return len(self.server.requests()) if self.server else 0

    def size(self) -> tuple[int, int]:
        """(files, bytes) of the store."""
        return self.server.size() if self.server else _files(Path(self.uri))

    def close(self) -> None:
        if self.server:
            self.server.close()


def fresh_search(settings: Any, ns: tuple[str, ...], query: str, runs: int = 3) -> dict[str, float]:
    """Median ms of ``runs`` fresh processes' first search (open the store, rank one query), and of embedding the
    query alone (part of it)."""
    laps, embeds = [], []
    for _ in range(runs):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                FRESH,
                settings.store_uri,
                json.dumps(ns),
                query,
                json.dumps(settings.store_options),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
        )
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        got = json.loads(out.stdout.strip().splitlines()[-1])
        laps.append(got["ms"])
        embeds.append(got["embed_ms"])
    return {"ms": round(statistics.median(laps), 1), "of_which_query_embedding_ms": round(statistics.median(embeds), 1)}


def run(kind: str, chunks: int, marks: list[int], search_at: list[int], data: Path) -> dict[str, Any]:
    from _lib.tables import table_versions
    from _lib.timed_embeddings import TimedEmbeddings
    from writer_overhead import answer

    from dualmem.config import Settings
    from dualmem.models import load_embeddings
    from dualmem.stores import open_store
    from dualmem.testing import FakeChatModel
    from dualmem.writer import write_history

    persona, sessions = history(chunks, data)
    with tempfile.TemporaryDirectory(prefix=f"growth-{kind}-") as tmp:
        place = Place(kind, Path(tmp))
        settings = Settings(store_uri=place.uri, store_options=place.options, checkpoint_path=f"{tmp}/c.sqlite")
        embedder = TimedEmbeddings(load_embeddings(settings.embedder, settings))
        store = open_store(settings, embedder)
        store.embeddings.embed_query("warm up the embedder")
        ns = (persona.id, "user")
        calls: list[tuple[float, float]] = []
        window: dict[int, dict[str, Any]] = {}
        points: list[dict[str, Any]] = []
        tables = lambda: table_versions(store._db)  # noqa: E731
        stops = {m - 5 for m in marks} | {m + 5 for m in marks} | set(marks) | set(search_at)

        def timed(messages: list[Any], tool: str | None = None) -> dict[str, Any]:
            try:
                return measured(messages, tool)
            except Exception as exc:  # a failed measurement ends the run (the writer would take it for a model error)
                raise SystemExit(f"measuring failed: {exc!r}") from exc

        def measured(messages: list[Any], tool: str | None = None) -> dict[str, Any]:
            start = time.perf_counter()
            i = len(calls)  # this chunk's index (one call per chunk)
            if i in stops:
                for m in marks:
                    if i == m + 5 and m in window:  # the window's end: requests first, then the (costly) reads
                        w = window[m]
                        w["requests"] = place.requests() - w["requests"]
                        now = tables()
                        w["commits"] = sum(now[t] - w["versions"].get(t, 0) for t in now)
                    if i == m - 5:
                        window[m] = {"versions": tables(), "requests": 0, "from": i}
                        window[m]["requests"] = place.requests()
                if i in set(search_at) | set(marks):
                    files, size = place.size()
                    point = {
                        "chunks_written": i,
                        "files": files,
                        "bytes": size,
                        "memory_versions": len(store.table.list_versions()),
                        "items": store.count(ns, status=None),
                    }
                    if i in search_at:
                        point["fresh_first_search"] = fresh_search(settings, ns, "how does the user feel about work?")
                    points.append(point)
                    print(json.dumps({kind: point}), flush=True)
                start = time.perf_counter()
            out = answer(messages, tool)
            calls.append((start, time.perf_counter()))
            if i and i % 500 == 0:  # long work shows progress
                print(f"{kind}: {i:,} of {chunks:,} chunks written", file=sys.stderr, flush=True)
            if len(calls) > chunks:
                raise KeyboardInterrupt("enough chunks")
            return out

        model = FakeChatModel(responses=[timed], cycle=True)
        started = time.perf_counter()
        try:
            write_history(sessions, persona, settings=settings, model=model, store=store, progress=False)
        except KeyboardInterrupt:
            pass
        wall = time.perf_counter() - started
        spans = [(a[1], b[0]) for a, b in zip(calls, calls[1:], strict=False)]
        gaps = [(b - a) * 1000 for a, b in spans]
        embedding = embedder.within(spans)
        at = []
        for m in marks:
            if m in window and "commits" in window[m]:
                w = window[m]
                n = m + 5 - w["from"]
                at.append(
                    {
                        "chunk": m,
                        "overhead_ms_p50": round(statistics.median(gaps[w["from"] : m + 4]), 1),
                        "embedder_ms_p50": round(statistics.median(embedding[w["from"] : m + 4]), 1),
                        "commits_per_chunk": round(w["commits"] / n, 2),
                        "requests_per_chunk": round(w["requests"] / n, 1) if kind == "s3" else None,
                    }
                )
        place.close()
    return {
        "place": kind,
        "command": "python benchmarks/growth.py " + " ".join(sys.argv[1:]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        "chunks": len(calls) - 1,
        "wall_s": round(wall, 1),
        "at": at,
        "points": points,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--s3-chunks", type=int, default=300, help="0: no S3 run")
    parser.add_argument("--marks", default="10,100,1000,10000")
    parser.add_argument("--search-at", default="100,1000,10000")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    marks = [int(m) for m in args.marks.split(",")]
    search_at = [int(m) for m in args.search_at.split(",")]
    runs = []
    for kind, n in (("local", args.chunks), ("s3", args.s3_chunks)):
        if n:
            # a mark's window ends 5 chunks after it: a run to chunk n writes 5 more when n is a mark
            extra = 5 if n in marks else 0
            runs.append(
                run(
                    kind,
                    n + extra,
                    [m for m in marks if m + 5 <= n + extra],
                    [s for s in search_at if s <= n],
                    Path(args.data),
                )
            )
    out = Path(args.out)
    ran = {r["place"] for r in runs}
    kept = [r for r in json.loads(out.read_text())["runs"] if r["place"] not in ran] if out.exists() else []
    result = {
        "benchmark": "growth along one long history: writer overhead, commits and requests per chunk, a fresh "
        "worker's first search, files and versions (write_history defaults, instant scripted writer)",
        "command": "python benchmarks/growth.py " + " ".join(sys.argv[1:]),  # the latest; each run names its own
        "runs": sorted([*runs, *kept], key=lambda r: r["place"] != "local"),
        "targets": {"overhead_ms_p50_max": 50.0, "commits_per_chunk_max": 2.0, "fresh_first_search_ms_max": 15.0},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
