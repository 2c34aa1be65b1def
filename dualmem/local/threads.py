"""Torch threads of a latency-bound embedding (a query and its context turns): one.

One short sequence gains little from intra-op parallelism, and next to other busy threads (another
job, or this process's own LanceDB runtime) torch's threads wait on each other: a RealMem query
took 26–42 ms on one thread against 95–140 ms on two in a retrieving process on 2 cores, and
85–186 ms on two with another job running (``benchmarks/chat_latency.py`` and
``benchmarks/realmem_retrieval.py`` measure the hot path). An idle process that only embeds gains
from two threads (16 ms against 28 ms), but a retrieving process is never that.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_state = {"users": 0, "saved": 0}


@contextmanager
def embedding_threads() -> Iterator[None]:
    """Run the block on one torch thread (the last block to leave restores torch's count)."""
    import torch

    with _lock:
        if _state["users"] == 0:
            _state["saved"] = torch.get_num_threads()
            torch.set_num_threads(1)
        _state["users"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                torch.set_num_threads(_state["saved"])
