"""Same history, same model answers, same memory: run after run, on either store, and after any number of crashes.

The writer is a scripted model that also UPDATEs and DELETEs items of its working view (``editing_writer``), so a
view that differed between runs (other items, another order, other short ids) would edit other items.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from dualmem.schema import Persona
from dualmem.stores import InMemoryDualStore, LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings, editing_writer, synthetic_history
from dualmem.writer import write_history

WORKER = Path(__file__).parent / "fixtures" / "writer_worker.py"
NS = ("p", "user")
SETTINGS = {"chunk_tokens": 120, "embedder": "hash:64"}


def memory(store) -> list[tuple]:
    """Every item of the namespace, any status: id, kind, text, status, grounding — sorted."""
    return sorted((i.id, i.kind, i.text, i.status, tuple(i.grounding)) for i in store.list(NS, status=None))


def written(store, sessions: int = 32) -> list[tuple]:
    model = FakeChatModel(responses=[editing_writer], cycle=True)
    report = write_history(
        synthetic_history(sessions),
        Persona(id="p", name="Pat"),
        model=model,
        store=store,
        settings=SETTINGS,
        progress=False,
    )
    assert not report.failed_chunks and any(
        op["op"] == "DELETE" for r in report.chunks for op in r.get("applied") or []
    )
    assert any(op["op"] == "UPDATE" for r in report.chunks for op in r.get("applied") or [])
    return memory(store)


def test_two_clean_runs_on_each_store_write_the_same_memory(tmp_path):
    first = written(LanceDualStore(str(tmp_path / "a"), HashEmbeddings(64)))
    assert first == written(LanceDualStore(str(tmp_path / "b"), HashEmbeddings(64)))
    assert first == written(InMemoryDualStore(HashEmbeddings(64)))
    assert sum(1 for *_, status, _ in first if status == "superseded") > 10  # the edits happened


def test_the_same_run_on_object_storage_writes_the_same_memory(tmp_path, s3_server):
    local = written(InMemoryDualStore(HashEmbeddings(64)), sessions=12)
    uri = f"s3://{s3_server['bucket']}/determinism-{time.time_ns()}"
    assert written(LanceDualStore(uri, HashEmbeddings(64), storage_options=s3_server["options"]), sessions=12) == local


TTL = 3.0  # a killed writer's lease frees after 3 s (the 60-s default would hold each resume for a minute)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_run_killed_at_random_moments_and_resumed_writes_the_clean_runs_memory(tmp_path):
    sessions = 16
    clean = written(InMemoryDualStore(HashEmbeddings(64)), sessions=sessions)
    uri, calls = str(tmp_path / "db"), tmp_path / "calls.log"
    rng = random.Random(20261127)
    kills = 0
    for _ in range(6):  # kill at a random model call, a random moment after it (drafting, planning, committing)
        target = _lines(calls) + rng.randint(1, 6)
        proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                json.dumps({"uri": uri, "sessions": sessions, "calls": str(calls), "delay": 0.02, "ttl": TTL}),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while _lines(calls) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.08))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
    assert kills >= 3
    done = subprocess.run(
        [sys.executable, str(WORKER), json.dumps({"uri": uri, "sessions": sessions, "calls": str(calls), "ttl": TTL})],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert memory(LanceDualStore(uri, HashEmbeddings(64))) == clean
