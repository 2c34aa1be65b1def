"""The LangGraph server's store path: 500 ``aput`` and 500 ``aget`` gathered at once, and 50 sequential puts, on the
``LanceDBStore`` as a Python caller builds it and on the store ``make_store`` gives the server (LangGraph's
``AsyncBatchedBaseStore`` over it: one batch per event-loop tick). Wall seconds on a fresh local folder.

    python benchmarks/store_serving.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


async def measure(batched: bool) -> dict[str, float]:
    from dualmem.config import Settings
    from dualmem.stores.langgraph_store import LanceDBStore, make_store

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DUALMEM_STORE_URI"] = f"{tmp}/db"
        os.environ.setdefault("DUALMEM_EMBEDDER", "hash:64")
        store = make_store() if batched else LanceDBStore.from_settings(Settings())
        await store.aput(("warm",), "k", {"v": 0})
        started = time.perf_counter()
        await asyncio.gather(
            *(store.aput(("users", f"u{i % 50}"), f"k{i}", {"v": i}) for i in range(500)),
            *(store.aget(("users", f"u{i % 50}"), f"k{i}") for i in range(500)),
        )
        gathered = time.perf_counter() - started
        assert len(await store.asearch(("users",), limit=1000)) == 500
        started = time.perf_counter()
        for i in range(50):
            await store.aput(("seq",), f"k{i}", {"v": i})
        return {
            "gathered_500_put_500_get_s": round(gathered, 2),
            "sequential_50_aput_s": round(time.perf_counter() - started, 2),
        }


def main() -> None:
    out = {
        "benchmark": "store_serving",
        "command": "python benchmarks/store_serving.py",
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores",
        "target_gathered_s_max": 1.0,
        "LanceDBStore": asyncio.run(measure(False)),
        "make_store (server)": asyncio.run(measure(True)),
    }
    path = REPO / "benchmarks" / "results" / "store_serving.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
