"""The tokenizer and BM25 of the lexical features."""

from __future__ import annotations

import numpy as np

from dualmem.lexical import TermMatrix, bm25, query_terms, tokenize
from dualmem.testing import HashEmbeddings


class CountingEmbeddings(HashEmbeddings):
    """Hash embeddings that count how many texts they embedded."""

    def __init__(self, dims: int = 32) -> None:
        super().__init__(dims)
        self.embedded = 0

    def embed_documents(self, texts):
        self.embedded += len(texts)
        return super().embed_documents(texts)


DOCS = [
    "I refill my dad's pill organizer every Sunday",
    "We went climbing on Thursday at the gym",
    "The shipment tracker keeps crashing at work",
    "Climbing shoes are expensive but the climbing gym is fun",
]


def test_tokenize_stems_and_drops_stopwords():
    assert tokenize("I was Climbing, they climbed; the climbs!") == ["climb", "climb", "climb"]


def test_bm25_statistics_are_those_of_the_documents_ranked():
    full, prefix = TermMatrix.build(DOCS), TermMatrix.build(DOCS[:2])
    query = query_terms("climbing gym thursday")
    scores = bm25(full.counts(query), full.lengths)
    visible = bm25(prefix.counts(query), prefix.lengths)
    assert not np.allclose(scores[:2], visible)  # the other documents change idf and average length
    assert set(np.argsort(-scores)[:2]) == {1, 3}
    assert bm25(full.counts(query_terms("pill organizer")), full.lengths)[0] > 0
    assert bm25(full.counts(query_terms("unknownword")), full.lengths).sum() == 0
