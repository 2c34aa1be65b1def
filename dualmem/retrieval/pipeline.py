"""The one retrieval pipeline: candidates from the store, features, the fitted ranker, a ranked list.

Every reader of memory ranks through :class:`Ranker` (``raw-turns``, ``dualmem``,
``DualMemRetriever``, the respond graph, the memory tools, the benchmarks):

1. **candidates** — the namespace's active items of the asked kinds, with their
   vectors, from the ranker's RAM snapshot of the namespace
   (:mod:`dualmem.retrieval.snapshot`: fresh against the store's version); a
   ``filter`` narrows them as in ``store.search``;
2. **query** — the query embedded once by the store's embedder, without the
   names of the namespace's speakers (people do not say their own names, so a
   name pulls the query away from the turns it asks about); the context turns
   (the recent conversation) embedded once each and remembered by the ranker;
3. **features** (:mod:`dualmem.retrieval.features`) fused by the weights
   (:mod:`dualmem.retrieval.weights`, shipped with the package);
4. **order** — best first; after the first ``cap_after`` items, at most
   ``max_per_session`` items of a session before items of other sessions (0: no
   cap) — both come with the weights (``ranker_max_per_session`` overrides the cap).

``ranker="vector" | "hybrid" | "fts"`` skips 3-4 and ranks the snapshot by cosine,
BM25 or both (:mod:`dualmem.retrieval.plain`). A namespace too large to hold in

>>> from dualmem.stores import open_store  # doctest: +SKIP
>>> Ranker("learned").rank(store, ("sophie", "user"), "when is the exam?", k=5, context=["I start revising today"])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from typing_extensions import TypedDict, Unpack

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.lexical import query_terms
from dualmem.retrieval import plain
from dualmem.retrieval.candidates import Candidates, from_snapshot
from dualmem.retrieval.context import context_turns
from dualmem.retrieval.features import QueryInput, features
from dualmem.retrieval.snapshot import Snapshot, Snapshots
from dualmem.retrieval.weights import LEARNED, PLAIN, RankerWeights, load_weights, shipped_path
from dualmem.schema import MemoryItem, MemoryKind
from dualmem.stores import dual_of
from dualmem.stores.contract import DualStore, Namespace
from dualmem.stores.results import DualResult, ScoredItem
from dualmem.vectors import dots

KINDS: tuple[MemoryKind, ...] = ("fact", "insight")
WORD = re.compile(r"[a-z0-9]+")
ROLE_NAMES = frozenset({"user", "assistant", "system", "human", "ai"})


def strip_names(text: str, names: Iterable[str]) -> str:
    """Return ``text`` without ``names`` (and their possessive), for the query's vector.

    >>> strip_names("When did Caroline's sister visit Melanie?", ["Caroline", "Melanie"])
    'When did sister visit ?'
    """
    out = text
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        out = re.sub(rf"\b{re.escape(name)}(?:'s)?\b", "", out, flags=re.IGNORECASE)
    out = re.sub(r"\s+", " ", out).strip()
    return out or text


def order(scores: np.ndarray, session: np.ndarray, k: int, max_per_session: int = 0, cap_after: int = 0) -> np.ndarray:
    """Return the indices of the ``k`` best scores: the first ``cap_after`` purely by score, then at most
    ``max_per_session`` items of a session (counting those already taken) before the rest (0: no cap).

    >>> order(np.array([0.9, 0.8, 0.7, 0.1]), np.array([0, 0, 0, 1]), 3, max_per_session=1).tolist()
    [0, 3, 1]
    >>> order(np.array([0.9, 0.8, 0.7, 0.1]), np.array([0, 0, 0, 1]), 3, max_per_session=1, cap_after=2).tolist()
    [0, 1, 3]
    """
    ranked = np.argsort(-scores, kind="stable")
    if not max_per_session or cap_after >= k:
        return ranked[:k]
    head = ranked[:cap_after].tolist()
    taken: dict[int, int] = {}
    for i in head:
        taken[int(session[i])] = taken.get(int(session[i]), 0) + 1
    first, later = list(head), []
    for i in ranked[cap_after:].tolist():
        s = int(session[i])
        if taken.get(s, 0) < max_per_session:
            taken[s] = taken.get(s, 0) + 1
            first.append(i)
            if len(first) == k:
                break
        else:
            later.append(i)
    return np.asarray((first + later)[:k], dtype=np.int64)


POOLED = "pooled"  # the group of :meth:`Ranker.rank`: every kind asked for, ranked as one pool


class RankOptions(TypedDict, total=False):
    """Keyword options of the ``rank`` functions and :meth:`Ranker.rank_kinds` (all optional)."""

    context: Sequence[Any] | None  # the conversation's recent turns (read by the learned ranker)
    kinds: Sequence[MemoryKind]  # which kinds to rank (default: facts and insights)
    filter: Mapping[str, Any] | None  # the store's metadata filter
    snapshot: Snapshot | None  # rank over this snapshot of the namespace (default: its latest version)


class Ranker:
    """Rank one namespace's memory for a query (see the module docstring); thread-safe.

    ``spec``: ``learned`` (the shipped weights), a weights file, or a plain store search
    (``vector``, ``hybrid``, ``fts``). ``max_per_session`` overrides the weights' cap;
    ``context_turns`` is how many recent turns of the conversation are read.
    """

    def __init__(
        self, spec: str = LEARNED, *, max_per_session: int | None = None, context_turns: int = 8, memo: int = 1024
    ) -> None:
        self.spec = str(spec)
        self.weights: RankerWeights | None = None if self.spec in PLAIN else load_weights(self.spec)
        cap = self.weights.max_per_session if self.weights is not None else 0
        self.max_per_session = cap if max_per_session is None or max_per_session < 0 else max_per_session
        self.cap_after = self.weights.cap_after if self.weights is not None else 0
        self.context_turns = context_turns
        self._memo: weakref.WeakKeyDictionary[Any, OrderedDict[str, np.ndarray]] = weakref.WeakKeyDictionary()
        self._memo_size = memo
        self._lock = threading.Lock()
        self.snapshots = Snapshots()

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Ranker:
        """Return the ranker the settings select (``ranker``, ``ranker_max_per_session``, ``ranker_context_turns``):
        one instance per choice in the process, so the context turns it embedded are remembered across callers."""
        s = Settings.resolve(settings)
        path = shipped_path() if s.tuning.ranker == LEARNED else Path(s.tuning.ranker).expanduser()
        stamp = path.stat().st_mtime_ns if s.tuning.ranker not in PLAIN and path.is_file() else 0
        return _shared(s.tuning.ranker, s.tuning.ranker_max_per_session, s.tuning.ranker_context_turns, stamp)

    # ------------------------------------------------------------------ public

    def forget(self) -> None:
        """Drop the query and context-turn vectors this ranker remembers (every embedder)."""
        with self._lock:
            self._memo.clear()

    def rank(
        self, store: DualStore, namespace: Namespace, query: str, k: int = 10, **options: Unpack[RankOptions]
    ) -> list[ScoredItem]:
        """Return the ``k`` best items of ``kinds`` in ``namespace`` for ``query``, best first."""
        if k <= 0:
            return []
        return self._ranked(store, namespace, query, k, pooled=True, **options)[POOLED]

    def rank_kinds(
        self, store: DualStore, namespace: Namespace, query: str, k: int = 10, **options: Unpack[RankOptions]
    ) -> dict[str, list[ScoredItem]]:
        """Return the ``k`` best items of each kind, ranked together (one query embedding, one feature pass)."""
        return self._ranked(store, namespace, query, k, pooled=False, **options)

    def dual(
        self,
        store: DualStore,
        namespace: Namespace,
        query: str,
        k_facts: int = 10,
        k_insights: int = 10,
        *,
        merged: bool = False,
        context: Sequence[Any] | None = None,
        expand: bool = True,
    ) -> DualResult:
        """Return ``k_facts`` facts and ``k_insights`` insights (or one merged top-k pool), insights with their cited facts.

        One snapshot serves the whole call: the facts that ground the insights are read at the version ranked.
        """
        store = dual_of(store)
        snap = self.snapshots.get(store, namespace)
        k = max(k_facts, k_insights)
        if merged:
            pool = self.rank(store, namespace, query, k, context=context, snapshot=snap)
            result = DualResult(
                merged=pool,
                facts=[h for h in pool if h.item.kind == "fact"],
                insights=[h for h in pool if h.item.kind == "insight"],
            )
        else:
            per_kind = self.rank_kinds(store, namespace, query, k, context=context, snapshot=snap)
            result = DualResult(facts=per_kind["fact"][:k_facts], insights=per_kind["insight"][:k_insights])
        if expand and result.insights:
            result.grounding = self.grounding(store, namespace, [h.item for h in result.insights], snapshot=snap)
        return result

    def grounding(
        self,
        store: DualStore,
        namespace: Namespace,
        insights: Sequence[MemoryItem],
        *,
        snapshot: Snapshot | None = None,
    ) -> dict[str, list[MemoryItem]]:
        """Return, per insight id, the facts it cites (:meth:`DualStore.grounding`), taking the active ones from
        ``snapshot`` (default: the namespace's latest): the store is read only for cited facts it does not hold."""
        store = dual_of(store)
        snap = snapshot if snapshot is not None else self.snapshots.get(store, namespace)
        rows = list(dict.fromkeys(snap.index[f] for i in insights for f in i.grounding if f in snap.index))
        return store.grounding(namespace, insights, known={item.id: item for item in snap.items(rows)})

    async def arank(
        self, store: DualStore, namespace: Namespace, query: str, k: int = 10, **kwargs: Any
    ) -> list[ScoredItem]:
        """Async :meth:`rank` (same core, in a worker thread)."""
        return await asyncio.to_thread(self.rank, store, namespace, query, k, **kwargs)

    def prepare(
        self,
        store: DualStore,
        namespace: Namespace,
        query: str,
        *,
        context: Sequence[Any] | None = None,
        kinds: Sequence[MemoryKind] = KINDS,
        filter: Mapping[str, Any] | None = None,
        snapshot: Snapshot | None = None,
    ) -> tuple[Candidates, QueryInput]:
        """Return the candidates (from ``snapshot``, default: the namespace's latest) and the embedded query."""
        kinds = _check_kinds(kinds)
        snap = snapshot if snapshot is not None else self.snapshots.get(dual_of(store), namespace)
        cands = from_snapshot(snap, kinds, snap.mask(filter=filter) if filter else None)
        turns = context_turns(context, self.context_turns)
        names = {str(s) for s in cands.speaker_codes()[0] if s and s not in ROLE_NAMES}  # people's names, not "User"
        texts = [strip_names(query, names), *(t.text for t in turns)]
        vectors = self._embed(store, texts)
        context_vector = None
        if turns:
            mean = vectors[1:].mean(axis=0)
            context_vector = mean / max(float(np.linalg.norm(mean)), 1e-9)
        q = QueryInput(
            vector=vectors[0],
            terms=query_terms(query),
            words=frozenset(WORD.findall(query.lower().replace("'s", " "))) - ROLE_NAMES,
            context_terms=query_terms(" ".join(t.content for t in turns)),
            context_vector=context_vector,
        )
        return cands, q

    # ------------------------------------------------------------------ internals

    def _ranked(
        self,
        store: DualStore,
        namespace: Namespace,
        query: str,
        k: int,
        *,
        pooled: bool,
        context: Sequence[Any] | None = None,
        kinds: Sequence[MemoryKind] = KINDS,
        filter: Mapping[str, Any] | None = None,
        snapshot: Snapshot | None = None,
    ) -> dict[str, list[ScoredItem]]:
        """Return the ``k`` best items of each group: all ``kinds`` pooled (key ``POOLED``), or each kind on its own,
        over ``snapshot`` (default: the namespace's latest)."""
        chosen = _check_kinds(kinds)
        store = dual_of(store)
        groups: dict[str, list[MemoryKind]] = {POOLED: chosen} if pooled else {kind: [kind] for kind in chosen}
        if self.weights is None:
            return {
                name: self._plain(store, namespace, query, k, group, filter, self.spec, snapshot)
                for name, group in groups.items()
            }
        cands, q = self.prepare(
            store, namespace, query, context=context, kinds=chosen, filter=filter, snapshot=snapshot
        )
        scores = dots(features(cands, q), self.weights.vector()) if len(cands) else np.zeros(0)
        kind_of = None if pooled else cands.kinds()
        out: dict[str, list[ScoredItem]] = {}
        for name, group in groups.items():
            rows = np.arange(len(cands)) if kind_of is None else np.flatnonzero(np.isin(kind_of, group))
            picked = (
                rows[order(scores[rows], cands.session[rows], k, self.max_per_session, self.cap_after)]
                if len(rows)
                else rows
            )
            out[name] = [
                ScoredItem(item, float(scores[i])) for item, i in zip(_items(cands, picked), picked, strict=True)
            ]
        return out

    def _embed(self, store: DualStore, texts: list[str]) -> np.ndarray:
        """Return unit vectors of ``texts`` (the query first), embedding only what is not remembered.

        An embedder that embeds queries as documents (``asymmetric is False``: the bundled one) also
        remembers the query: in a chat the user's earlier messages, each a query once, come back as
        context turns. (The query is not batched with the context turns: padded to their length, a
        short query would cost more than its own pass.)
        """
        embeddings = store.embeddings
        symmetric = getattr(embeddings, "asymmetric", None) is False
        with self._lock:
            try:
                memo = self._memo.setdefault(embeddings, OrderedDict())
            except TypeError:  # an embedder that cannot be weakly referenced: nothing remembered
                memo = OrderedDict()
            known = {t: memo[t] for t in (texts if symmetric else texts[1:]) if t in memo}
        known_query = known.get(texts[0]) if symmetric else None
        query = (
            known_query
            if known_query is not None
            else _unit(np.asarray(embeddings.embed_query(texts[0]), dtype=np.float32))
        )
        todo = [t for t in dict.fromkeys(texts[1:]) if t not in known and not (symmetric and t == texts[0])]
        vectors = {
            t: _unit(np.asarray(v, dtype=np.float32))
            for t, v in zip(todo, embeddings.embed_documents(todo) if todo else [], strict=True)
        }
        if symmetric:
            vectors.setdefault(texts[0], query)
        with self._lock:
            memo.update(vectors)
            while len(memo) > self._memo_size:
                memo.popitem(last=False)
        return np.stack([query, *({**known, **vectors}[t] for t in texts[1:])])

    def _plain(
        self,
        store: DualStore,
        namespace: Namespace,
        query: str,
        k: int,
        kinds: Sequence[MemoryKind],
        filter: Mapping[str, Any] | None,
        mode: str,
        snap: Snapshot | None = None,
    ) -> list[ScoredItem]:
        """Rank by cosine, BM25 or both over the snapshot."""
        vector = None if mode == "fts" else store.embeddings.embed_query(query)
        snap = snap if snap is not None else self.snapshots.get(store, namespace)
        found = plain.search(snap, query, vector, k, mode, snap.mask(kinds=_check_kinds(kinds), filter=filter))
        return [
            ScoredItem(item, score) for item, (_, score) in zip(snap.items([r for r, _ in found]), found, strict=True)
        ]


def rank(
    store: DualStore,
    namespace: Namespace,
    query: str,
    k: int = 10,
    *,
    ranker: Ranker | str | None = None,
    settings: Settings | None = None,
    **options: Unpack[RankOptions],
) -> list[ScoredItem]:
    """Return the ``k`` best items of ``namespace`` for ``query`` with ``ranker`` (default: the settings' ranker)."""
    chosen = ranker if isinstance(ranker, Ranker) else Ranker(ranker) if ranker else Ranker.from_settings(settings)
    return chosen.rank(store, namespace, query, k, **options)


@lru_cache(maxsize=32)
def _shared(spec: str, max_per_session: int, context_turns: int, stamp: int) -> Ranker:
    return Ranker(spec, max_per_session=max_per_session, context_turns=context_turns)


def _check_kinds(kinds: Sequence[MemoryKind] | str) -> list[MemoryKind]:
    chosen = [kinds] if isinstance(kinds, str) else list(kinds)
    bad = [k for k in chosen if k not in KINDS]
    if bad or not chosen:
        raise ConfigurationError(
            f"kinds {bad or chosen} are not fact or insight; pass kinds=('fact',), ('insight',) or both"
        )
    return list(dict.fromkeys(chosen))  # type: ignore[arg-type]


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / max(float(np.linalg.norm(vector)), 1e-9)


def _items(cands: Candidates, picked: np.ndarray) -> list[Any]:
    """Return the memory items of the ``picked`` candidates (one row take per snapshot)."""
    out: list[Any] = [None] * len(picked)
    by_snapshot: dict[int, tuple[Any, list[int], list[int]]] = {}
    for slot, i in enumerate(picked.tolist()):
        snapshot, row = cands.refs[i]
        by_snapshot.setdefault(id(snapshot), (snapshot, [], []))
        by_snapshot[id(snapshot)][1].append(slot)
        by_snapshot[id(snapshot)][2].append(row)
    for snapshot, slots, rows in by_snapshot.values():
        for slot, item in zip(slots, snapshot.items(rows), strict=True):
            out[slot] = item
    return out
