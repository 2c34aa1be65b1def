"""The embedder timing the writer benchmarks split their overhead with (benchmarks/_lib/timed_embeddings.py)."""

from __future__ import annotations

import sys
import time

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from _lib.timed_embeddings import TimedEmbeddings

from dualmem.testing import HashEmbeddings


class SlowEmbeddings(HashEmbeddings):
    """Hash embeddings that take 20 ms a call."""

    def embed_documents(self, texts):
        time.sleep(0.02)
        return super().embed_documents(texts)

    def embed_query(self, text):
        time.sleep(0.02)
        return super().embed_query(text)


def test_the_embedder_time_is_counted_in_the_gap_it_fell_in_and_nowhere_else():
    timed = TimedEmbeddings(SlowEmbeddings(16))
    first = time.perf_counter()
    assert timed.embed_query("a") == HashEmbeddings(16).embed_query("a")  # answers as the embedder it wraps
    timed.embed_documents(["b", "c"])
    middle = time.perf_counter()
    time.sleep(0.03)  # no embedding here
    last = time.perf_counter()
    inside, outside = timed.within([(first, middle), (middle, last)])
    assert 35 <= inside <= (middle - first) * 1000
    assert outside == 0.0
    assert timed.dims == 16
