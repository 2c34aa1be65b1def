"""BM25 over a term matrix's postings scores as the dense formula does, on any rows and on chunk-long queries."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dualmem import lexical
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


# --------------------------------------------------------------------------- counting a namespace's texts

ODD = [
    "",
    "   ",
    "I was Climbing, they climbed; the climbs!",
    "rock'n'roll isn't it's 'quoted' words'' ''x a''b o'",
    "CAFÉ crème brûlée — naïve façade ÆON ǅungla İstanbul ﬁne Kelvin: K",  # non-ASCII: case and separators
    "tabs\tand\nnewlines\r\nand\x00nul and 123 4th 1990s 2's",
    "emoji 🙂 between🙂words and ’curly’ quotes “here”",
    "a b c d e f 1 2 3",  # one-letter words are dropped
    "the and of to in",  # stopwords only
    "a lone \ud800surrogate\udfff between words",  # a Python string may hold one (an in-memory store's text)
]


def _by_tokenize(text):
    """A text's term ids and counts as the definition says: :func:`tokenize`'s terms."""
    ids = np.fromiter((lexical.term_id(t) for t in lexical.tokenize(text)), np.int64)
    return np.unique(ids, return_counts=True)


@pytest.mark.parametrize("one_pass", [False, True])
def test_counted_terms_are_tokenizes_on_any_text(one_pass, monkeypatch):
    rnd = random.Random(3)
    alphabet = "abcxyz019 '’-.,;:!?\t\nÉéİıßæ🙂ﬁ\x00"
    texts = [*ODD, *("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 60))) for _ in range(300))]
    texts += [t.upper() for t in ODD]
    monkeypatch.setattr(lexical, "ONE_PASS_CHARS", -1 if one_pass else 10**9)
    counted = lexical._count(texts)
    assert len(counted) == len(texts)
    for text, (ids, counts) in zip(texts, counted, strict=True):
        want_ids, want_counts = _by_tokenize(text)
        assert ids.tolist() == want_ids.tolist(), text
        assert counts.tolist() == want_counts.astype(float).tolist(), text


def test_a_long_history_is_counted_stemming_each_distinct_word_once(monkeypatch):
    """A fresh process's first matrix over a long history: the cost follows its distinct words, not its words."""
    rnd = random.Random(4)
    vocabulary = [f"topic{i}ing" for i in range(500)]
    texts = [" ".join(rnd.choice(vocabulary) for _ in range(80)) + f" note{i}" for i in range(2_000)]
    stemmed = []
    monkeypatch.setattr(lexical, "stem", lambda word, real=lexical.stem: stemmed.append(word) or real(word))
    matrix = TermMatrix.build(texts)
    assert len(stemmed) == len(set(stemmed)) <= 500 + 2_000  # 162,000 words in all
    assert matrix.lengths.sum() == sum(len(lexical.tokenize(t)) for t in texts)
    again = len(stemmed)
    TermMatrix.build([*texts, "one new topic1ing text"])  # a namespace that gained an item: only it is counted
    assert len(stemmed) - again <= 4


def test_text_terms_went_in_0_6_0_and_texts_terms_counts_one_text():
    """``text_terms`` warned through 0.5.x and is gone; the batch form counts one text as it did."""
    assert not hasattr(lexical, "text_terms")
    ids, counts = lexical.texts_terms(["Thursday night climbing, then the night shift again"])[0]
    assert dict(zip(ids.tolist(), counts.tolist(), strict=True))[lexical.term_id(lexical.stem("night"))] == 2
