"""Term counts of memory texts and BM25 over any subset of them, for the ranker's lexical features.

Texts are tokenized by :func:`tokenize` (lower-cased content words, a light
deterministic stemmer, English stopwords dropped) into term ids of
one process-wide vocabulary (string interning: a term keeps its id for the
life of the process), and each text's counts are memoised, so rebuilding the
term matrix of a namespace that gained a session costs one concatenation.
The texts a matrix has not seen are counted in one pass (:func:`texts_terms`):
their words are found and counted with arrow's compute functions and each
distinct word is stemmed once, so a fresh process's first matrix over a long
history costs about what reading the texts does, not a Python loop per word;
the terms are exactly :func:`tokenize`'s.

BM25 statistics (document frequency, number and average length of documents)
are always those of the documents being ranked — a replay that may only see
the past never borrows statistics from the future.

>>> terms = TermMatrix.build(["night shift nurse", "climbing on thursday", "thursday night"])
>>> [round(float(s), 2) for s in bm25(terms.counts(query_terms("thursday climbing")), terms.lengths)]
[0.0, 1.54, 0.5]
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import sparse

TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SPACED = bytes(c if chr(c) in "abcdefghijklmnopqrstuvwxyz0123456789'" else 32 for c in range(256))
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
    return [stem(w) for w in TOKEN.findall(text.lower()) if _kept(w)]


def _kept(word: str) -> bool:
    """Whether a word TOKEN matched is a term (not a stopword, more than one letter)."""
    return word not in STOPWORDS and len(word) > 1


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


Terms = tuple[np.ndarray, np.ndarray]  # a text's distinct term ids (ascending) and their counts
_TEXTS: OrderedDict[str, Terms] = OrderedDict()  # the terms of the texts counted last (at most TEXTS_KEPT)
_TEXTS_LOCK = threading.Lock()
TEXTS_KEPT = 131_072
ONE_PASS_CHARS = 20_000  # new texts longer than this in all are counted in one pass (fewer: word by word)


def texts_terms(texts: Sequence[str]) -> list[Terms]:
    """Return each text's distinct term ids (ascending) and their counts, those of :func:`tokenize`'s terms: the
    memoised texts looked up, the others counted together (:func:`_count`)."""
    with _TEXTS_LOCK:
        found = [_TEXTS.get(t) for t in texts]
        for text, terms in zip(texts, found, strict=True):
            if terms is not None:
                _TEXTS.move_to_end(text)
    new = list(dict.fromkeys(t for t, terms in zip(texts, found, strict=True) if terms is None))
    if not new:
        return found  # type: ignore[return-value]
    counted = dict(zip(new, _count(new), strict=True))
    with _TEXTS_LOCK:
        _TEXTS.update(counted)
        while len(_TEXTS) > TEXTS_KEPT:
            _TEXTS.popitem(last=False)
    return [terms if terms is not None else counted[t] for t, terms in zip(texts, found, strict=True)]


def _count(texts: Sequence[str]) -> list[Terms]:
    """Count the terms of ``texts``: word by word for a few short texts, else in one pass (:func:`_count_all`)."""
    if sum(len(t) for t in texts) > ONE_PASS_CHARS:
        return _count_all(texts)
    out = []
    for text in texts:
        found = np.array([_word_id(w) for w in TOKEN.findall(text.lower())], dtype=np.int64)
        ids, counts = np.unique(found[found >= 0], return_counts=True)
        out.append((ids, counts.astype(np.float64)))
    return out


def _count_all(texts: Sequence[str]) -> list[Terms]:
    """Count the terms of ``texts`` in one pass: every byte that no TOKEN match holds becomes a space (a
    non-ASCII character is never in one), so the runs between spaces are TOKEN's matches (a run holding an
    apostrophe is matched with TOKEN itself); each distinct word is stemmed once."""
    runs = pc.ascii_split_whitespace(_strings([t.lower() for t in texts], _SPACED))
    words, docs = pc.list_flatten(runs), pc.list_parent_indices(runs).to_numpy()
    quoted = pc.match_substring(words, "'").to_numpy(zero_copy_only=False)
    split = [
        (d, w)
        for d, run in zip(docs[quoted], pc.filter(words, quoted).to_pylist(), strict=True)
        for w in TOKEN.findall(run)
    ]
    words = pa.concat_arrays([pc.filter(words, ~quoted), _strings([w for _, w in split])])
    docs = np.concatenate([docs[~quoted], np.fromiter((d for d, _ in split), np.int64, len(split))])
    encoded = pc.dictionary_encode(words)
    ids = np.array([_word_id(w) for w in encoded.dictionary.to_pylist()] + [-1], dtype=np.int64)
    terms = ids[encoded.indices.fill_null(-1).to_numpy()]
    keep = terms >= 0
    width = int(terms.max()) + 1 if len(terms) else 1
    pairs, counts = np.unique(docs[keep] * width + terms[keep], return_counts=True)  # (doc, term) ascending
    bounds = np.searchsorted(pairs, np.arange(len(texts) + 1) * width)
    return [(pairs[a:b] % width, counts[a:b].astype(np.float64)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _strings(texts: Sequence[str], table: bytes | None = None) -> pa.Array:
    """Return ``texts`` as an arrow string array, their UTF-8 bytes mapped through ``table`` (None: as they are;
    a table must map every non-ASCII byte to an ASCII one, so that the result stays UTF-8)."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]  # a lone surrogate is a non-ASCII character too
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    data = b"".join(encoded)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data if table is None else data.translate(table))]
    return pa.Array.from_buffers(pa.large_string(), len(encoded), buffers)


def _word_id(word: str) -> int:
    """Return the term id of a word TOKEN matched (-1: :func:`tokenize` drops it)."""
    return term_id(stem(word)) if _kept(word) else -1


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
        parts = texts_terms(texts)
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
