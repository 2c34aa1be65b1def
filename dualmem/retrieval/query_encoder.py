"""Fine-tune the query side of a sentence-transformers embedder against frozen document vectors.

Memory stores hold document vectors made once, by the bundled embedder.
Questions, though, are not phrased like the turns that answer them ("When did
Caroline go to the support group?" against "I went to a support group
yesterday"). :func:`finetune_query_encoder` trains a copy of the embedder on
labelled ``(question, answering documents)`` pairs so that the *question*
vector moves towards its documents, while the documents keep the vectors they
already have in the store: nothing is re-embedded.

The loss is a listwise softmax over every document of the question's group
(a conversation, a persona's memory): the other documents of the same group
are the hard negatives the ranker must beat. With several positives the loss
is ``-log Σ_pos p`` (any positive will do).

:class:`QueryTunedEmbeddings` plugs the tuned encoder into a store: documents
through the original embedder, queries through the tuned one.

Evaluate it on groups it was not trained on (leave one group out): training
and testing on the same questions only measures memorisation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings


@dataclass(frozen=True)
class QueryGroup:
    """Questions and the frozen unit vectors of the documents they are ranked against."""

    doc_vectors: np.ndarray
    queries: Sequence[str]
    positives: Sequence[Sequence[int]]

    def __post_init__(self) -> None:
        vectors = np.asarray(self.doc_vectors)
        if vectors.ndim != 2 or not len(vectors):
            raise ValueError(f"doc_vectors must be a non-empty 2-D array, got shape {vectors.shape}")
        if len(self.queries) != len(self.positives):
            raise ValueError(f"{len(self.queries)} queries but {len(self.positives)} positive lists: give one per query")
        for i, pos in enumerate(self.positives):
            bad = [p for p in pos if not 0 <= p < len(vectors)]
            if bad:
                raise ValueError(f"query {i}: positive indices {bad} out of range 0..{len(vectors) - 1}")


@dataclass(frozen=True)
class QueryEncoderConfig:
    """Training settings (defaults: leave-one-conversation-out on LoCoMo, ``benchmarks/locomo_retrieval.py``)."""

    epochs: int = field(default=2, metadata={"help": "passes over the training questions"})
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW learning rate"})
    temperature: float = field(default=0.05, metadata={"help": "softmax temperature of the cosine scores"})
    batch_size: int = field(default=16, metadata={"help": "questions per step (all from one group)"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    seed: int = field(default=0, metadata={"help": "seed of the shuffling and of dropout"})


def finetune_query_encoder(
    model: Any,
    groups: Sequence[QueryGroup],
    config: QueryEncoderConfig | None = None,
    progress: str | None = None,
) -> list[float]:
    """Train ``model`` (a ``SentenceTransformer``, changed in place) on ``groups``; return the loss of each step.

    Only questions with at least one positive are used. The model is left in
    eval mode. Pass a copy when the original must stay as it is.
    """
    import torch
    from tqdm import tqdm

    cfg = config or QueryEncoderConfig()
    steps = [(g, i) for g, group in enumerate(groups) for i, pos in enumerate(group.positives) if len(pos)]
    if not steps:
        raise ValueError("no question has a positive document: nothing to train on")
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    docs = [torch.as_tensor(np.asarray(g.doc_vectors, dtype=np.float32)) for g in groups]
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    losses: list[float] = []
    model.train()
    try:
        for _ in range(cfg.epochs):
            by_group: dict[int, list[int]] = {}
            for g, i in rng.sample(steps, len(steps)):
                by_group.setdefault(g, []).append(i)
            batches = [(g, ids[k : k + cfg.batch_size]) for g, ids in by_group.items() for k in range(0, len(ids), cfg.batch_size)]
            rng.shuffle(batches)
            for g, ids in tqdm(batches, desc=progress, disable=progress is None, leave=False, unit="batch"):
                group = groups[g]
                vectors = _encode(model, [group.queries[i] for i in ids])
                log_p = torch.log_softmax(vectors @ docs[g].T / cfg.temperature, dim=1)
                per_query = [torch.logsumexp(log_p[row, list(group.positives[i])], dim=0) for row, i in enumerate(ids)]
                loss = -torch.stack(per_query).mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(float(loss.detach()))
    finally:
        model.eval()
    return losses


def encode_queries(model: Any, queries: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Return unit vectors of ``queries`` from ``model`` (float32 rows; ``(0, dims)`` for none)."""
    if not queries:
        return np.zeros((0, model.get_embedding_dimension()), np.float32)
    vectors = model.encode(list(queries), batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float32)


def _encode(model: Any, texts: list[str]) -> Any:
    import torch

    features = model.preprocess(texts)
    return torch.nn.functional.normalize(model(features)["sentence_embedding"], dim=1)


class QueryTunedEmbeddings(Embeddings):
    """Documents through one embedder, queries through another (a fine-tuned query encoder).

    Stores keep the document vectors they have; only queries change::

        model.save("runs/query-encoder")
        embeddings = QueryTunedEmbeddings(load_embeddings("bundled"), load_embeddings("runs/query-encoder"))
    """

    def __init__(self, documents: Embeddings, queries: Embeddings) -> None:
        self.documents = documents
        self.queries = queries

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents with the document embedder."""
        return self.documents.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        """Embed a query with the query embedder."""
        return self.queries.embed_query(text)
