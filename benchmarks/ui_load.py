"""Page loads of the memory browser (``dualmem ui``) for a namespace of 1k, 10k and 100k items.

Each size is written into one namespace of a fresh LanceDB folder (hash embeddings: the browser's pages do not embed,
except search; 40 items per session, as a writer makes them), ``dualmem ui`` serves it on a loopback port (the
product's entry point), and each page is fetched ``--repeats`` times over HTTP: the user's first page of items
(newest first, with counts and session filter), the tenth page, an item with its history, and a search (the learned
ranker). Figures are wall milliseconds per request, p50 and max, on this machine.

    python benchmarks/ui_load.py --sizes 1000 10000 100000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
NS = ("mara", "theo")
TOPICS = ["night shift", "garden tomatoes", "sister Ana", "old piano", "bakery job", "winter coat", "sailing boat"]


def populate(uri: str, n: int) -> str:
    from dualmem.schema import Fact, Insight, SourceRef
    from dualmem.stores import LanceDualStore
    from dualmem.testing import HashEmbeddings

    dual = LanceDualStore(uri, HashEmbeddings(64))
    batch = 5000
    for start in range(0, n, batch):
        items = []
        for i in range(start, min(n, start + batch)):
            text = f"item {i}: the user talked about the {TOPICS[i % len(TOPICS)]} in session {i // 40}"
            source = SourceRef(session_id=f"s{i // 40}", turn_ids=[f"s{i // 40}-t{i % 40}"])
            if i % 5 == 4:
                items.append(
                    Insight(
                        id=f"i{i}", namespace=NS, text="I read this as " + text, grounding=[f"f{i - 1}"], source=source
                    )
                )
            else:
                items.append(Fact(id=f"f{i}", namespace=NS, text=text, source=source))
        dual.upsert(items)
        print(f"  {min(n, start + batch):,} / {n:,} items written", file=sys.stderr)
    return "f0"


def timed(url: str, repeats: int) -> dict[str, float]:
    import httpx

    times = []
    with httpx.Client(timeout=120) as client:
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code, response.text[-500:])
    return {"p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "n": repeats}


def measure(n: int, repeats: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        item = populate(f"{tmp}/db", n)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**os.environ, "DUALMEM_STORE_URI": f"{tmp}/db", "DUALMEM_EMBEDDER": "hash:64"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "dualmem.cli", "ui", "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.2)
            base = f"http://127.0.0.1:{port}/p/{NS[0]}/u/{NS[1]}"
            timed(base, 1)  # the server's first request opens the store
            return {
                "items": n,
                "first page": timed(base, repeats),
                "tenth page": timed(base + "?offset=450", repeats),
                "item with history": timed(f"{base}/i/{item}", repeats),
                "search": timed(f"{base}/search?q=night+shift+sister", repeats),
            }
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ui_load.json"))
    args = parser.parse_args()
    runs = []
    for n in args.sizes:
        print(f"{n:,} items", file=sys.stderr)
        runs.append(measure(n, args.repeats))
        print(json.dumps(runs[-1]), file=sys.stderr)
    out = {
        "benchmark": "ui_load",
        "command": "python benchmarks/ui_load.py --sizes " + " ".join(str(n) for n in args.sizes),
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores",
        "target_first_page_ms_max": 1000,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
