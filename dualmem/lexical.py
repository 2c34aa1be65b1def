"""Term counts of memory texts and BM25 over any subset of them, for the ranker's lexical features.

Texts are tokenized by :func:`tokenize` (lower-cased content words, a light
deterministic stemmer, English stopwords dropped) into term ids of
one process-wide vocabulary (string interning: a term keeps its id for the
life of the process), and each text's counts are memoised, so rebuilding the
term matrix of a namespace that gained a session costs one concatenation.

BM25 statistics (document frequency, number and average length of documents)
are always those of the documents being ranked — a replay that may only see
the past never borrows statistics from the future.

>>> terms = TermMatrix.build(["night shift nurse", "climbing on thursday", "thursday night"])
>>> [round(float(s), 2) for s in bm25(terms.counts(query_terms("thursday climbing")), terms.lengths)]
[0.0, 1.47, 0.44]
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from functools import lru_cache

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
    """Return lower-cased, stemmed content words of ``text``.

    >>> tokenize("I was Climbing, they climbed; the climbs!")
    ['climb', 'climb', 'climb']
    """
    return [stem(w) for w in TOKEN.findall(text.lower()) if w not in STOPWORDS and len(w) > 1]


_VOCAB: dict[str, int] = {}
_VOCAB_LOCK = threading.Lock()
K1 = 1.2


def term_id(term: str) -> int:
    """Return the process-wide id of ``term`` (new terms get the next id)."""
    tid = _VOCAB.get(term)
    if tid is None:
        with _VOCAB_LOCK:
            tid = _VOCAB.setdefault(term, len(_VOCAB))
    return tid


@lru_cache(maxsize=131_072)
def text_terms(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the distinct term ids of ``text`` and their counts (memoised)."""
    ids = np.fromiter((term_id(t) for t in tokenize(text)), dtype=np.int64)
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    uniq, counts = np.unique(ids, return_counts=True)
    return uniq, counts.astype(np.float64)


def query_terms(text: str) -> np.ndarray:
    """Return the distinct term ids of a query, in the order of the terms themselves (unknown terms included: they
    match nothing). Term ids depend on what a process tokenized first; a score summed over the query's terms in id
    order would differ in its last bits from one process to the next, and break ties differently."""
    terms = sorted(set(tokenize(text)))
    return np.fromiter((term_id(t) for t in terms), dtype=np.int64, count=len(terms))


class TermMatrix:
    """Term counts of documents (rows) over the process vocabulary, column-sliced per query."""

    def __init__(self, matrix: sparse.csc_matrix, lengths: np.ndarray) -> None:
        self.matrix = matrix
        self.lengths = lengths

    @classmethod
    def build(cls, texts: Sequence[str]) -> TermMatrix:
        """Return the term matrix of ``texts``."""
        parts = [text_terms(t) for t in texts]
        indptr = np.zeros(len(parts) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(ids) for ids, _ in parts])
        indices = np.concatenate([ids for ids, _ in parts]) if parts else np.zeros(0, np.int64)
        data = np.concatenate([c for _, c in parts]) if parts else np.zeros(0)
        width = int(indices.max()) + 1 if len(indices) else 1
        csr = sparse.csr_matrix((data, indices, indptr), shape=(len(parts), width))
        return cls(csr.tocsc(), np.asarray(csr.sum(axis=1)).ravel())

    def __len__(self) -> int:
        return int(self.matrix.shape[0])

    def counts(self, terms: np.ndarray) -> np.ndarray:
        """Return the dense ``documents x terms`` counts of ``terms`` (ids beyond the matrix count 0)."""
        out = np.zeros((len(self), len(terms)))
        inside = terms < self.matrix.shape[1]
        if inside.any():
            out[:, inside] = self.matrix[:, terms[inside]].toarray()
        return out

    def bm25(self, terms: np.ndarray, rows: np.ndarray, *, k1: float = K1, b: float = 0.75) -> np.ndarray:
        """Return BM25 of ``terms`` for each of ``rows`` over the documents ``rows`` (their statistics), as
        :func:`bm25` of their dense counts, but reading only the postings of ``terms``: the cost grows with the
        documents holding a query term, not with documents x query terms (a writer's view query is a whole chunk)."""
        scores = np.zeros(len(rows))
        terms = terms[terms < self.matrix.shape[1]]
        if not len(rows) or not len(terms):
            return scores
        slot = np.full(len(self), -1, dtype=np.int64)
        slot[rows] = np.arange(len(rows))
        postings = self.matrix[:, terms].tocoo()
        keep = slot[postings.row] >= 0
        doc, term, count = slot[postings.row[keep]], postings.col[keep], postings.data[keep]
        idf, norm = _weights(np.bincount(term, minlength=len(terms)), self.lengths[rows], k1, b)
        return np.bincount(doc, weights=count * (k1 + 1.0) / (count + norm[doc]) * idf[term], minlength=len(rows))


def bm25(counts: np.ndarray, lengths: np.ndarray, *, k1: float = K1, b: float = 0.75) -> np.ndarray:
    """Return BM25 per document from its query-term ``counts`` (documents x terms) and lengths."""
    n = len(lengths)
    if n == 0 or counts.shape[1] == 0:
        return np.zeros(n)
    idf, norm = _weights((counts > 0).sum(axis=0), lengths, k1, b)
    return ((counts * (k1 + 1.0)) / (counts + norm[:, None]) * idf[None, :]).sum(axis=1)


def _weights(df: np.ndarray, lengths: np.ndarray, k1: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """Return BM25's per-term idf (from document frequencies ``df`` over ``len(lengths)`` documents) and per-document
    length norm: the one formula both the dense and the postings scoring use."""
    idf = np.log(1.0 + (len(lengths) - df + 0.5) / (df + 0.5))
    return idf, k1 * (1.0 - b + b * lengths / max(float(lengths.mean()), 1e-9))
