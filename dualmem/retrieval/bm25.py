"""Okapi BM25 over a growing document list, with statistics of a visible prefix only.

Documents get positions in the order they were added; ``scores(query, upto=n)``
ranks the first ``n`` documents with document frequencies, ``N`` and average
length computed on those ``n`` alone — so a replay that may only see the past
never borrows statistics from the future.

>>> index = BM25([tokenize("night shift nurse"), tokenize("climbing on thursday")])
>>> [bool(s > 0) for s in index.scores(tokenize("thursday climbing"))]
[False, True]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from scipy import sparse

TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just let me more most my myself no nor not now
    of off on once only or other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up very was we were what
    when where which while who whom why will with would you your yours yourself yourselves i'm i've i'd i'll it's
    that's don't can't im ive id ill also really just like get got go going want know think one s t""".split()
)


def stem(word: str) -> str:
    """Strip common English suffixes (a light, deterministic stemmer)."""
    if "'" in word:
        word = word.split("'", 1)[0]
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", ""), ("ly", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: len(word) - len(suffix)] + keep
    return word


def tokenize(text: str) -> list[str]:
    """Return lower-cased, stemmed content words of ``text``."""
    return [stem(w) for w in TOKEN.findall(text.lower()) if w not in STOPWORDS and len(w) > 1]


class BM25:
    """Okapi BM25 (k1, b) over documents given as token lists; documents can be appended."""

    def __init__(self, docs: Sequence[Sequence[str]] = (), *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.vocab: dict[str, int] = {}
        self._rows: list[dict[int, int]] = []
        self._matrix: sparse.csc_matrix | None = None
        self._lengths = np.zeros(0)
        self.add(docs)

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, docs: Sequence[Sequence[str]]) -> None:
        """Append documents (token lists)."""
        for doc in docs:
            row: dict[int, int] = {}
            for tok in doc:
                tid = self.vocab.setdefault(tok, len(self.vocab))
                row[tid] = row.get(tid, 0) + 1
            self._rows.append(row)
        if docs:
            self._matrix = None

    def _build(self) -> sparse.csc_matrix:
        if self._matrix is None:
            data, rows, cols = [], [], []
            for r, row in enumerate(self._rows):
                for c, v in row.items():
                    rows.append(r)
                    cols.append(c)
                    data.append(v)
            shape = (len(self._rows), max(len(self.vocab), 1))
            self._matrix = sparse.csc_matrix((np.asarray(data, float), (rows, cols)), shape=shape)
            self._lengths = np.asarray([sum(r.values()) for r in self._rows], dtype=float)
        return self._matrix

    def tfidf(self, upto: int | None = None) -> sparse.csr_matrix:
        """Return L2-normalised sublinear tf-idf rows of the first ``upto`` documents (their statistics only)."""
        n = len(self._rows) if upto is None else min(upto, len(self._rows))
        matrix = sparse.csr_matrix(self._build()[:n])
        df = np.asarray((matrix > 0).sum(axis=0)).ravel()
        idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
        weighted = matrix.copy()
        weighted.data = 1.0 + np.log(weighted.data)
        weighted = sparse.csr_matrix(weighted.multiply(idf[None, :]))
        norms = np.sqrt(np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        return sparse.csr_matrix(sparse.diags(1.0 / norms) @ weighted)

    def tfidf_query(self, query: Sequence[str], upto: int | None = None) -> np.ndarray:
        """Return the cosine between ``query`` (as a sublinear tf-idf vector) and each of the first ``upto`` documents."""
        n = len(self._rows) if upto is None else min(upto, len(self._rows))
        counts: dict[int, int] = {}
        for tok in query:
            if tok in self.vocab:
                counts[self.vocab[tok]] = counts.get(self.vocab[tok], 0) + 1
        if n == 0 or not counts:
            return np.zeros(n)
        terms = np.asarray(list(counts), dtype=int)
        df = np.asarray((self._build()[:n][:, terms] > 0).sum(axis=0)).ravel()
        weights = (1.0 + np.log(np.asarray(list(counts.values()), dtype=float))) * (np.log((1.0 + n) / (1.0 + df)) + 1.0)
        weights /= max(float(np.linalg.norm(weights)), 1e-12)
        return np.asarray(self.tfidf(n)[:, terms] @ weights).ravel()

    def scores(self, query: Sequence[str], upto: int | None = None) -> np.ndarray:
        """Return the BM25 score of each of the first ``upto`` documents (all by default)."""
        n = len(self._rows) if upto is None else min(upto, len(self._rows))
        out = np.zeros(n)
        terms = [self.vocab[t] for t in dict.fromkeys(query) if t in self.vocab]
        if n == 0 or not terms:
            return out
        matrix = self._build()[:n][:, terms].toarray()  # n x |terms|
        lengths = self._lengths[:n]
        avgdl = max(lengths.mean(), 1e-9)
        df = (matrix > 0).sum(axis=0)
        idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        norm = self.k1 * (1.0 - self.b + self.b * lengths / avgdl)
        tf = matrix
        out = ((tf * (self.k1 + 1.0)) / (tf + norm[:, None]) * idf[None, :]).sum(axis=1)
        return out
