"""The ranker's features: one row per candidate item, computed for one query (and its conversation).

Continuous features are z-scored over the candidates of the query (item
features over items, session features over sessions, then given to each item
of the session), so one weight vector fits namespaces of any size. Indicators
and recency stay raw. The conversation context (the turns said before the
query in the current chat) feeds the ``ctx_*`` features; they are 0 without it.

Item features:

- ``dense``: cosine between the query and the item;
- ``bm25``: BM25 of the query's terms against the item's text;
- ``win_dense`` / ``win_bm25``: the same against the item joined with its two
  neighbours of the same session (an answer is often split over turns);
- ``nb_dense`` / ``nb_bm25``: the best adjacent item's cosine / BM25 (an
  answer often sits next to the turn that matches the words);
- ``speaker``: the item's speaker is named in the query ("When did Caroline…");
- ``user``: the item is a user turn.

Session features (the item's source session):

- ``s_dense_max`` / ``s_dense_mean``: the best and the mean item cosine;
- ``s_user_max`` / ``s_other_max``: the best cosine among the session's user turns / its other items;
- ``s_centroid``: cosine between the query and the session's centroid;
- ``s_bm25``: BM25 of the query against the whole session's text;
- ``ctx_dense``: cosine between the session's centroid and the context's;
- ``ctx_bm25``: BM25 of the context against the whole session's text;
- ``qc_bm25``: BM25 of the query and context together against it;
- ``thread``: the tf-idf affinity of query and context to each session,
  averaged over the session's tf-idf neighbours (sessions of one project
  share rare words even when the query does not);
- ``recent_3`` / ``recent_30``: ``exp(-age / tau)``, age counted in sessions;
- ``propagation``: similarity (centroid cosine, damped by age) to the three
  sessions that best match the query by ``s_dense_max + s_bm25`` — a
  project's latest session is found through its older, better-matching ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from dualmem.lexical import bm25
from dualmem.retrieval.candidates import Candidates
from dualmem.vectors import dots

FEATURES: tuple[str, ...] = (
    "dense",
    "bm25",
    "win_dense",
    "win_bm25",
    "nb_dense",
    "nb_bm25",
    "speaker",
    "user",
    "s_dense_max",
    "s_user_max",
    "s_other_max",
    "s_dense_mean",
    "s_centroid",
    "s_bm25",
    "ctx_dense",
    "ctx_bm25",
    "qc_bm25",
    "thread",
    "recent_3",
    "recent_30",
    "propagation",
    "s_novelty",
    "s_user_words",
    "s_size",
    "dense_rank",
)
SESSION_B = 0.3  # BM25 length normalisation of whole sessions (long sessions are not penalised much)
PROPAGATION_TOP = 3
PROPAGATION_TAU = 10.0


@dataclass
class QueryInput:
    """A query as the features read it: unit vector, term ids, context terms and vector, lower-cased words."""

    vector: np.ndarray
    terms: np.ndarray
    words: frozenset[str] = frozenset()
    context_terms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    context_vector: np.ndarray | None = None


def zscore(values: np.ndarray) -> np.ndarray:
    """Return ``values`` standardised to mean 0 and deviation 1 (zeros when constant)."""
    if len(values) < 2:
        return np.zeros(len(values))
    sd = float(values.std())
    return (values - values.mean()) / sd if sd > 1e-12 else np.zeros(len(values))


def _neighbour(values: np.ndarray, index: np.ndarray, fill: float) -> np.ndarray:
    return np.where(index >= 0, values[np.maximum(index, 0)], fill)


def _thread(c: Candidates, terms: np.ndarray) -> np.ndarray:
    """Return each session's tf-idf affinity to ``terms``, averaged over its tf-idf neighbour sessions."""
    if "thread" not in c.cache:
        counts = c.session_terms().copy()
        df = np.asarray((counts > 0).sum(axis=0)).ravel()
        idf = np.log((1.0 + c.n_sessions) / (1.0 + df)) + 1.0
        counts.data = 1.0 + np.log(counts.data)
        weighted = sparse.csr_matrix(counts.multiply(idf[None, :]))
        norms = np.sqrt(np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel())
        weighted = sparse.csc_matrix(sparse.diags(1.0 / np.maximum(norms, 1e-12)) @ weighted)
        # the neighbour weights are W Wᵀ without its diagonal, each row over its sum; kept factored (never the
        # sessions x sessions matrix, which a namespace of many session-less items would make huge)
        self_sim = np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel()
        row_sums = np.asarray(weighted @ (weighted.T @ np.ones(weighted.shape[0]))).ravel() - self_sim
        c.cache["thread"] = (weighted, idf, self_sim, row_sums + 1e-9)
    weighted, idf, self_sim, row_sums = c.cache["thread"]
    terms = terms[terms < weighted.shape[1]]
    if not len(terms):
        return np.zeros(c.n_sessions)
    weights = idf[terms] / max(float(np.linalg.norm(idf[terms])), 1e-12)
    affinity = np.asarray(weighted[:, terms] @ weights).ravel()
    return (np.asarray(weighted @ (weighted.T @ affinity)).ravel() - self_sim * affinity) / row_sums


def centroids_static(c: Candidates) -> np.ndarray:
    """Return each session's unit centroid (cached per candidate set)."""
    if "centroids" not in c.cache:
        cen = np.asarray(c.members() @ c.vectors)
        c.cache["centroids"] = cen / np.maximum(np.linalg.norm(cen, axis=1, keepdims=True), 1e-9)
    return c.cache["centroids"]


def _windows(c: Candidates) -> np.ndarray:
    """Return each item's unit vector joined with its two neighbours of the session (cached per candidate set)."""
    if "windows" not in c.cache:
        has_prev, has_next = c.prev >= 0, c.next >= 0
        window = c.vectors.copy()
        window[has_prev] += c.vectors[c.prev[has_prev]]
        window[has_next] += c.vectors[c.next[has_next]]
        window /= np.maximum(np.linalg.norm(window, axis=1, keepdims=True), 1e-9)
        c.cache["windows"] = window
    return c.cache["windows"]


def _sizes(c: Candidates) -> np.ndarray:
    """Return how many items each session holds (cached per candidate set)."""
    if "sizes" not in c.cache:
        c.cache["sizes"] = np.asarray(c.members().sum(axis=1)).ravel()
    return c.cache["sizes"]


def _novelty(c: Candidates, centroids: np.ndarray) -> np.ndarray:
    """Return 1 - the best centroid cosine of each session to an earlier one (a thread's first session is novel)."""
    if "novelty" not in c.cache:
        sims = centroids @ centroids.T
        sims[np.triu_indices(len(sims))] = -1.0
        c.cache["novelty"] = 1.0 - np.maximum(sims.max(axis=1), -1.0)
        c.cache["novelty"][0] = c.cache["novelty"][1:].max(initial=0.0) if len(sims) > 1 else 0.0
    return c.cache["novelty"]


def features(c: Candidates, q: QueryInput) -> np.ndarray:
    """Return the ``items x FEATURES`` matrix of ``c`` for query ``q``."""
    n, s_count = len(c), c.n_sessions
    out = np.zeros((n, len(FEATURES)))
    if n == 0:
        return out
    col = {name: i for i, name in enumerate(FEATURES)}
    vectors, session = c.vectors, c.session
    dense = dots(vectors, q.vector)
    counts, lengths = c.term_counts(q.terms), c.lengths()
    item_bm25 = bm25(counts, lengths)
    has_prev, has_next = c.prev >= 0, c.next >= 0
    window = _windows(c)
    win_counts = (
        counts + counts[np.maximum(c.prev, 0)] * has_prev[:, None] + counts[np.maximum(c.next, 0)] * has_next[:, None]
    )
    win_lengths = lengths + _neighbour(lengths, c.prev, 0.0) + _neighbour(lengths, c.next, 0.0)
    low = float(dense.min())
    out[:, col["dense"]] = zscore(dense)
    out[:, col["bm25"]] = zscore(item_bm25)
    out[:, col["win_dense"]] = zscore(dots(window, q.vector))
    out[:, col["win_bm25"]] = zscore(bm25(win_counts, win_lengths))
    out[:, col["nb_dense"]] = zscore(np.maximum(_neighbour(dense, c.prev, low), _neighbour(dense, c.next, low)))
    out[:, col["nb_bm25"]] = zscore(np.maximum(_neighbour(item_bm25, c.prev, 0.0), _neighbour(item_bm25, c.next, 0.0)))
    if q.words:
        speakers, at = c.speaker_codes()
        named = np.isin(at, [i for i, sp in enumerate(speakers) if sp and sp in q.words])
        if 0 < named.sum() < n:
            out[:, col["speaker"]] = named
    out[:, col["user"]] = c.roles == "user"

    members = c.members()
    sizes = _sizes(c)
    best = np.full(s_count, -np.inf)
    np.maximum.at(best, session, dense)
    user = c.roles == "user"
    best_user = np.full(s_count, np.nan)
    best_other = np.full(s_count, np.nan)
    np.fmax.at(best_user, session[user], dense[user])
    np.fmax.at(best_other, session[~user], dense[~user])
    centroids = centroids_static(c)
    session_lengths = members @ lengths
    s_bm25 = zscore(bm25(np.asarray(members @ counts), session_lengths, b=SESSION_B))
    s_best = zscore(best)
    per_session = {
        "s_dense_max": s_best,
        "s_user_max": zscore(np.where(np.isnan(best_user), low, best_user)),
        "s_other_max": zscore(np.where(np.isnan(best_other), low, best_other)),
        "s_dense_mean": zscore((members @ dense) / sizes),
        "s_centroid": zscore(dots(centroids, q.vector)),
        "s_bm25": s_bm25,
    }
    if q.context_vector is not None:
        per_session["ctx_dense"] = zscore(dots(centroids, q.context_vector))
    if len(q.context_terms):
        per_session["ctx_bm25"] = zscore(
            bm25(np.asarray(members @ c.term_counts(q.context_terms)), session_lengths, b=SESSION_B)
        )
    both = np.union1d(q.terms, q.context_terms)
    if len(q.context_terms):
        per_session["qc_bm25"] = zscore(bm25(np.asarray(members @ c.term_counts(both)), session_lengths, b=SESSION_B))
    else:
        per_session["qc_bm25"] = s_bm25
    if s_count > 1:
        per_session["thread"] = zscore(_thread(c, both))
    age = (s_count - 1 - np.arange(s_count)).astype(float)
    per_session["recent_3"] = np.exp(-age / 3.0)
    per_session["recent_30"] = np.exp(-age / 30.0)
    if s_count > 1:
        top = np.argsort(-(s_best + s_bm25), kind="stable")[:PROPAGATION_TOP]
        sims = dots(centroids, centroids[top])
        sims[top, np.arange(len(top))] = 0.0  # a session does not propagate to itself
        per_session["propagation"] = zscore(sims.max(axis=1) * np.exp(-age / PROPAGATION_TAU))
    if s_count > 1:
        per_session["s_novelty"] = zscore(_novelty(c, centroids_static(c)))
    user_words = members @ np.where(user, lengths, 0.0)
    per_session["s_user_words"] = zscore(np.log1p(user_words))
    per_session["s_size"] = zscore(np.log1p(sizes))
    rank = np.empty(n)
    rank[np.argsort(-dense, kind="stable")] = np.arange(n)
    out[:, col["dense_rank"]] = 1.0 / (1.0 + rank / 5.0)
    for name, values in per_session.items():
        out[:, col[name]] = values[session]
    return out
