"""A disk cache of text embeddings: every text is embedded once per embedder, ever.

Vectors live in ``<folder>/<embedder-key>/`` as ``vectors.npy`` (float32 rows)
and ``keys.json`` (sha256 of each text, same order); both are replaced
atomically, so a killed run keeps what it had saved. Benchmarks replay long
histories many times; with the cache only new texts cost embedder time.

A cached vector is the one computed the first time the text was missed, in
whatever batch held it then. The bundled embedder's vector for a text differs
in the last bits with the batch (next to a longer text, by up to about 6e-8),
and stored vectors are rounded to float16, so retrieval figures replayed from
an empty cache can differ from the published ones in the fourth decimal. With
the same cache they reproduce exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from langchain_core.embeddings import Embeddings

DEFAULT_FOLDER = Path(".dualmem") / "embedding-cache"
QUERY_MARK = "\x00query\x00"  # prefixes the cache key of a query of an asymmetric embedder


def text_key(text: str) -> str:
    """Return the cache key of a text (sha256 hex, first 32 chars)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _atomic_save(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class EmbeddingCache:
    """Embed texts through a persistent per-embedder cache; return L2-normalised float32 rows."""

    def __init__(
        self, embeddings: Embeddings, folder: str | Path = DEFAULT_FOLDER, name: str | None = None, *, autosave: int = 1
    ) -> None:
        """``autosave``: write the cache once this many new texts are unsaved (1: after every call that embedded
        something; a replay embedding one query at a time passes more and calls :meth:`save` at the end)."""
        self.embeddings = embeddings
        self.autosave = max(1, autosave)
        self._unsaved = 0
        self._lock = threading.RLock()  # replays of several personas may share one cache
        key = name or _embedder_key(embeddings)
        self.folder = Path(folder) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index: dict[str, int] = {}
        self._vectors = np.zeros((0, 0), dtype=np.float32)
        self.misses = 0
        self._load()

    def _load(self) -> None:
        keys_path, vec_path = self.folder / "keys.json", self.folder / "vectors.npy"
        if keys_path.exists() and vec_path.exists():
            keys = json.loads(keys_path.read_text())
            vectors = np.load(vec_path)
            if len(keys) == len(vectors):
                self._index = {k: i for i, k in enumerate(keys)}
                self._vectors = vectors.astype(np.float32, copy=False)

    def save(self) -> None:
        """Write the cache to disk (atomically)."""
        with self._lock:
            self._save()

    def _save(self) -> None:
        keys = sorted(self._index, key=self._index.__getitem__)
        self._unsaved = 0
        _atomic_save(self.folder / "vectors.npy", self._write_vectors)
        _atomic_save(self.folder / "keys.json", lambda p: None if p.write_text(json.dumps(keys)) else None)

    def _write_vectors(self, path: Path) -> None:
        with open(path, "wb") as fh:
            np.save(fh, self._vectors)

    def __len__(self) -> int:
        return len(self._index)

    def missing(self, texts: Sequence[str]) -> list[str]:
        """Return the distinct texts not cached yet (cache keys: see :meth:`embed`)."""
        return list(dict.fromkeys(t for t in texts if text_key(t) not in self._index))

    def embed(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 64,
        save_every: int = 20,
        progress: str | None = None,
        query: bool = False,
    ) -> np.ndarray:
        """Return one normalised row per text, embedding only the texts not cached yet.

        ``query``: the texts are search queries; an embedder that embeds queries differently from
        documents (``asymmetric``, e.g. e5's ``query:`` prefix) keeps them under keys of their own.
        """
        if query and getattr(self.embeddings, "asymmetric", False):
            with self._lock:
                keys = [QUERY_MARK + t for t in texts]
                todo = self.missing(keys)
                if todo:
                    vectors = np.asarray(
                        [self.embeddings.embed_query(t[len(QUERY_MARK) :]) for t in todo], dtype=np.float32
                    )
                    self._add(todo, vectors)
                    self.misses += len(todo)
                    self._unsaved += len(todo)
                    if self._unsaved >= self.autosave:
                        self._save()
                return self._vectors[[self._index[text_key(k)] for k in keys]] if keys else self._vectors[:0]
        with self._lock:
            return self._embed(texts, batch_size, save_every, progress)

    def _embed(self, texts: Sequence[str], batch_size: int, save_every: int, progress: str | None) -> np.ndarray:
        todo = self.missing(texts)
        if todo:
            todo.sort(key=len)  # similar lengths batch with little padding
            batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
            iterator = batches
            if progress is not None:
                from tqdm import tqdm

                iterator = tqdm(batches, desc=progress, unit="batch")
            for n, batch in enumerate(iterator, start=1):
                self._add(batch, np.asarray(self.embeddings.embed_documents(list(batch)), dtype=np.float32))
                self._unsaved += len(batch)
                if n % save_every == 0 and self._unsaved >= self.autosave:
                    self.save()
            self.misses += len(todo)
            if self._unsaved >= self.autosave:
                self.save()
        if not texts:
            return np.zeros((0, self._vectors.shape[1] if self._vectors.size else 0), dtype=np.float32)
        return self._vectors[[self._index[text_key(t)] for t in texts]]

    def _add(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        vectors = vectors / norms
        if self._vectors.size == 0:
            self._vectors = vectors
        else:
            self._vectors = np.concatenate([self._vectors, vectors])
        start = len(self._index)
        for i, text in enumerate(texts):
            self._index[text_key(text)] = start + i


def _embedder_key(embeddings: Embeddings) -> str:
    path = getattr(embeddings, "path", None)
    name = Path(str(path)).parent.name if path else type(embeddings).__name__
    dims = getattr(embeddings, "dims", "")
    seq = getattr(getattr(embeddings, "model", None), "max_seq_length", "")
    raw = f"{name}-{dims}-{seq}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)


class CachedEmbeddings(Embeddings):
    """LangChain embeddings served from an :class:`EmbeddingCache` (misses are embedded and kept)."""

    def __init__(self, cache: EmbeddingCache) -> None:
        self.cache = cache
        self.dims = getattr(cache.embeddings, "dims", None)
        self.asymmetric = getattr(cache.embeddings, "asymmetric", None)  # None: unknown (queries and documents apart)
        self.path = getattr(cache.embeddings, "path", None)  # reports name the embedder behind the cache

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed several texts through the cache."""
        return self.cache.embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query through the cache."""
        return self.cache.embed([text], query=True)[0].tolist()
