"""BM25 over a term matrix's postings scores as the dense formula does, on any rows and on chunk-long queries."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dualmem.lexical import TermMatrix, bm25, query_terms

WORDS = [f"word{i}" for i in range(300)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_postings_bm25_is_the_dense_bm25_of_the_rows_ranked(seed):
    rnd = random.Random(seed)
    texts = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(0, 15))) for _ in range(400)]
    matrix = TermMatrix.build(texts)
    query = " ".join(rnd.sample(WORDS, 120)) + " neverseenbefore"  # a chunk-long query, one unknown term
    terms = query_terms(query)
    for rows in (np.arange(400), np.flatnonzero(np.arange(400) % 3 == 1), np.array([5]), np.zeros(0, np.int64)):
        dense = bm25(matrix.counts(terms)[rows], matrix.lengths[rows])
        sparse = matrix.bm25(terms, rows)
        assert sparse.shape == dense.shape
        np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-9)
        touched = (matrix.counts(terms)[rows] > 0).any(axis=1)
        assert (sparse[~touched] == 0).all() and (sparse[touched] > 0).all()


def test_a_query_of_unknown_terms_scores_nothing():
    matrix = TermMatrix.build(["night shift nurse", "climbing on thursday"])
    assert matrix.bm25(query_terms("zzzunknownzzz qqqunseenqqq"), np.arange(2)).tolist() == [0.0, 0.0]
