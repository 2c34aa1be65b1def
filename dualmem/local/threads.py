"""How many torch threads a latency-bound embedding (a query and its context turns) should use.

On an idle 2-core machine two intra-op threads embed a RealMem query in 18 ms against 28 ms on
one; when the CPU is shared its threads wait on each other: 85–186 ms on two against 33 ms on
one, with another job running (``benchmarks/chat_latency.py`` measures the hot path). So a
query gets as many threads as there are cores left idle by *other* processes, measured over the
time since the previous query from the kernel's CPU counters (``/proc/stat`` for the machine,
``/proc/self/stat`` for this process, whose own threads do not count); the first query, or a
machine without those files, falls back to the 1-minute load average.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_state: dict[str, float] = {"users": 0, "saved": 0, "t": 0.0, "total": 0.0, "own": 0.0, "others": -1.0}
MIN_WINDOW_S = 0.05  # a shorter gap since the last sample keeps the last estimate
MAX_WINDOW_S = 30.0  # a longer one says little about now: measured afresh from the next query on


def cores() -> int:
    """Return how many CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _counters() -> tuple[float, float] | None:
    """Return (busy CPU seconds of the machine, CPU seconds of this process) since boot, or None."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as fh:
            own = fh.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / tick, (float(own[11]) + float(own[12])) / tick  # utime + stime


def others_load() -> float:
    """Return how many cores other processes kept busy since the previous call (the load average at first)."""
    now, counters = time.monotonic(), _counters()
    with _lock:
        gap = now - _state["t"]
        if counters is not None and MIN_WINDOW_S <= gap <= MAX_WINDOW_S and _state["others"] >= 0:
            total, own = counters
            _state["others"] = max(0.0, ((total - _state["total"]) - (own - _state["own"])) / gap)
        elif counters is None or _state["others"] < 0 or gap > MAX_WINDOW_S:
            try:
                _state["others"] = os.getloadavg()[0]
            except OSError:  # no load figures on this platform: assume the CPU is shared
                _state["others"] = float(cores())
        if counters is not None and gap >= MIN_WINDOW_S:
            _state["t"], (_state["total"], _state["own"]) = now, counters
        return _state["others"]


def query_threads(default: int) -> int:
    """Return the threads for one latency-bound embedding: the cores other processes leave idle, 1 to ``default``."""
    return max(1, min(default, round(cores() - others_load())))


@contextmanager
def embedding_threads() -> Iterator[None]:
    """Run the block on :func:`query_threads` torch threads (the last block to leave restores torch's count)."""
    import torch

    with _lock:
        if _state["users"] == 0:
            _state["saved"] = torch.get_num_threads()
        _state["users"] += 1
        first = _state["users"] == 1
    if first:
        torch.set_num_threads(query_threads(int(_state["saved"])))
    try:
        yield
    finally:
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                torch.set_num_threads(int(_state["saved"]))
