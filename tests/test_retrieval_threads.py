"""Ranking's products run on the calling thread: a recall leaves no BLAS worker threads spinning.

numpy's OpenBLAS threads a matrix-vector product of a few thousand rows, then keeps its worker threads
spinning for about 100 ms of CPU; on a small machine that CPU is taken from the query's embedder and the
other requests. Measured as the process's CPU time while it sleeps right after the call.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from dualmem.retrieval import Ranker
from dualmem.schema import Fact, SourceRef
from dualmem.stores import LanceDualStore
from dualmem.testing import HashEmbeddings
from dualmem.vectors import dots

NS = ("sophie", "u1")
ROWS = 3000


def _cpu_while_idle(seconds: float = 0.3) -> float:
    """Return the CPU-seconds this process (all its threads) spends while the calling thread sleeps."""
    start = time.process_time()
    time.sleep(seconds)
    return time.process_time() - start


def test_dots_is_the_matrix_product_for_a_vector_and_for_rows():
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((50, 8)).astype(np.float32)
    vector, rows = rng.standard_normal(8).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(dots(matrix, vector), matrix @ vector, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dots(matrix, rows), matrix @ rows.T, rtol=1e-5, atol=1e-6)
    assert dots(matrix, rows).shape == (50, 3)


def test_a_ranking_leaves_no_blas_thread_spinning(tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: a BLAS library starts no worker threads to leave spinning")
    rng = np.random.default_rng(1)
    matrix, query = rng.standard_normal((ROWS, 384)).astype(np.float32), rng.standard_normal(384).astype(np.float32)
    time.sleep(0.3)  # earlier work's thread pools settle
    matrix @ query
    spun = _cpu_while_idle()
    if spun < 0.03:
        pytest.skip(f"this numpy's BLAS does not thread a {ROWS} x 384 product ({spun * 1000:.0f} ms of CPU after it)")

    store = LanceDualStore(str(tmp_path / "db"), HashEmbeddings(384))
    store.upsert(
        [
            Fact(
                id=f"f{i}",
                namespace=NS,
                text=f"note {i} about gardens bikes thesis {i % 17} and lab {i % 29}",
                source=SourceRef(session_id=f"s{i // 10}", turn_ids=[f"s{i // 10}-{i % 10}"]),
            )
            for i in range(ROWS)
        ]
    )
    ranker = Ranker()
    assert ranker.rank(store, NS, "the thesis on gardens", 5)  # the first call builds the snapshot
    time.sleep(0.3)
    assert ranker.rank(store, NS, "my bike at the lab", 5)
    after = _cpu_while_idle()
    assert after < spun / 2, (
        f"a ranking left {after * 1000:.0f} ms of CPU behind it (a threaded product: {spun * 1000:.0f} ms)"
    )
