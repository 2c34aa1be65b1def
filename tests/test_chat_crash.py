"""kill -9 of a chat process between its replies and the written memory: nothing lost, nothing written twice.

A real process chats through `create_agent` + DualMemMiddleware and is killed with SIGKILL (a) before its
turns are written, (b) while the writer runs, (c) after the chunk is applied but before its turns leave the
pending list. Then `dualmem flush` (another real process) writes what was left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO

from dualmem.chat.pending import PendingThread
from dualmem.stores import LanceDBStore
from dualmem.testing import HashEmbeddings

WORKER = REPO / "tests" / "fixtures" / "chat_worker.py"
NS = ("dr-lee", "alice")
MESSAGES = [f"Last week I started evening classes number {i} and they tire me out more than work." for i in range(4)]


def _store(uri: str) -> LanceDBStore:
    from dualmem.stores import LanceDualStore

    dual = LanceDualStore(uri, HashEmbeddings(64))
    return LanceDBStore(uri, dual=dual)


@pytest.mark.parametrize("moment", ["idle", "writing", "settling"])
def test_kill_9_between_reply_and_write_loses_and_duplicates_nothing(tmp_path, moment):
    uri = str(tmp_path / "db")
    args = {"uri": uri, "thread": "th-1", "messages": MESSAGES, "mode": moment}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(args)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    wait_for = {"idle": f"replied {len(MESSAGES)}", "writing": "writing", "settling": None}[moment]
    for line in proc.stdout:
        if wait_for and line.strip() == wait_for:
            proc.send_signal(signal.SIGKILL)
            break
    assert proc.wait(timeout=120) == -signal.SIGKILL

    store = _store(uri)
    left = PendingThread(store, NS, "th-1").read()
    assert len(left.turns) == 2 * len(MESSAGES), "every exchange survived the crash as pending turns"
    facts_before = store.dual.list(NS, kind="fact")
    if moment == "settling":
        assert len(facts_before) == 1 and all(t["seal"] for t in left.turns)  # applied, not yet removed
    else:
        assert facts_before == []
    assert all(t["seal"] for t in left.turns) == (moment != "idle")

    env = {
        **os.environ,
        "DUALMEM_STORE_URI": uri,
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_LEASE_TTL_S": "2",
    }
    out = subprocess.run(
        [sys.executable, "-m", "dualmem.cli", "flush", "--now"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dr-lee / alice / th-1: 1 chunk(s); 0 turn(s) still pending" in out.stdout

    assert PendingThread(store, NS, "th-1").read().turns == []
    facts = store.dual.list(NS, kind="fact")
    cited = [t for f in facts for t in f.source.turn_ids]
    user_turns = [t["id"] for t in left.turns if t["role"] == "user"]
    assert sorted(cited) == sorted(user_turns), "each user turn is in memory exactly once"
    assert len(facts) == 1 and len(store.dual.ledger.applied_ids(NS)) == 1 and store.dual.ledger.look(NS, "")[1] == []
    if moment == "settling":  # its rows were written, its ledger mark not yet: the recorded plan is replayed
        assert [f.id for f in facts] == [f.id for f in facts_before]  # the same rows, not a second answer
    assert "memory formed: 1 chunk(s)" in out.stdout
