"""The items a ranker scores: a namespace's memory as arrays (texts, vectors, sessions, order, speakers).

:class:`Candidates` is built from a namespace's RAM snapshot
(:mod:`dualmem.retrieval.snapshot`, one kind at a time) or directly from
arrays (tests, fitting). Every item belongs to a session: its source session,
or a session of its own when it has none (a memory written by a tool).
Sessions are numbered oldest first by their first item's ``created_at``
(sessions are ingested in time order); inside a session items are ordered by
``meta["turn_index"]`` when they have one, else by ``created_at``. ``prev`` and
``next`` point at the adjacent item of the same session (-1 at the ends).

What depends only on a snapshot's rows (its texts' term matrix, the arrays
below) is kept in the snapshot's ``derived`` slot, so a namespace that did not
change is prepared once, whatever the number of queries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from scipy import sparse

from dualmem.lexical import TermMatrix
from dualmem.retrieval.snapshot import Snapshot

DERIVED_KEY = "dualmem.retrieval.candidates"


@dataclass
class Candidates:
    """Items to rank, in arrays (see the module docstring).

    ``terms`` pairs each term matrix with the candidate position of each of its rows (-1: not a
    candidate), so a subset shares its parent's matrices; ``refs`` say where each item came from.
    """

    ids: list[str]
    texts: list[str]
    vectors: np.ndarray
    session: np.ndarray
    session_ids: list[str]
    session_time: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    speakers: np.ndarray
    roles: np.ndarray
    terms: list[tuple[TermMatrix, np.ndarray]]
    refs: list[tuple[Any, int]]
    cache: dict[str, Any] = field(default_factory=dict)  # query-independent arrays, computed once per set

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def n_sessions(self) -> int:
        """Return how many sessions the items come from."""
        return len(self.session_ids)

    def term_counts(self, terms: np.ndarray) -> np.ndarray:
        """Return the ``items x terms`` counts of query ``terms``."""
        out = np.zeros((len(self), len(terms)))
        for matrix, pos in self.terms:
            inside = pos >= 0
            out[pos[inside]] = matrix.counts(terms)[inside]
        return out

    def lengths(self) -> np.ndarray:
        """Return each item's number of terms."""
        if "lengths" not in self.cache:
            out = np.zeros(len(self))
            for matrix, pos in self.terms:
                inside = pos >= 0
                out[pos[inside]] = matrix.lengths[inside]
            self.cache["lengths"] = out
        return self.cache["lengths"]

    def kinds(self) -> np.ndarray:
        """Return each item's kind, read from the snapshot row it came from (cached per set)."""
        if "kinds" not in self.cache:
            self.cache["kinds"] = np.asarray([held.kinds[row] for held, row in self.refs], dtype=object)
        return self.cache["kinds"]

    def speaker_codes(self) -> tuple[list[Any], np.ndarray]:
        """Return the distinct speakers and each item's position among them (cached per set)."""
        if "speaker_codes" not in self.cache:
            code: dict[Any, int] = {}
            at = np.fromiter((code.setdefault(s, len(code)) for s in self.speakers), dtype=np.int64, count=len(self))
            self.cache["speaker_codes"] = (list(code), at)
        return self.cache["speaker_codes"]

    def members(self) -> sparse.csr_matrix:
        """Return the ``sessions x items`` membership matrix."""
        if "members" not in self.cache:
            n = len(self)
            self.cache["members"] = sparse.csr_matrix(
                (np.ones(n), (self.session, np.arange(n))), shape=(self.n_sessions, n)
            )
        return self.cache["members"]

    def session_terms(self) -> sparse.csr_matrix:
        """Return the ``sessions x vocabulary`` term counts of each session's whole text."""
        if "session_terms" not in self.cache:
            width = max((m.matrix.shape[1] for m, _ in self.terms), default=1)
            total = sparse.csr_matrix((self.n_sessions, width))
            for matrix, pos in self.terms:
                inside = np.flatnonzero(pos >= 0)
                rows = sparse.csr_matrix(
                    (np.ones(len(inside)), (self.session[pos[inside]], inside)), shape=(self.n_sessions, len(matrix))
                )
                part = sparse.csr_matrix(rows @ matrix.matrix)
                part.resize((self.n_sessions, width))
                total = total + part
            self.cache["session_terms"] = sparse.csr_matrix(total)
        return self.cache["session_terms"]

    @classmethod
    def build(
        cls,
        ids: Sequence[str],
        texts: Sequence[str],
        vectors: np.ndarray,
        session_ids: Sequence[str | None],
        times: Sequence[float],
        positions: Sequence[float | None] | None = None,
        speakers: Sequence[str | None] | None = None,
        roles: Sequence[str | None] | None = None,
        refs: Sequence[tuple[Any, int]] | None = None,
    ) -> Candidates:
        """Return candidates from arrays; ``times`` order sessions and items (ingest time), ``positions`` turns."""
        n = len(ids)
        sessions = [s or f"item:{i}" for s, i in zip(session_ids, ids, strict=True)]
        times_arr = np.asarray(times, dtype=np.float64).reshape(n)
        first: dict[str, float] = {}
        for s, t in zip(sessions, times_arr.tolist(), strict=True):
            first[s] = min(first.get(s, t), t)
        ordered = sorted(first, key=lambda s: (first[s], s))
        code = {s: i for i, s in enumerate(ordered)}
        session = np.fromiter((code[s] for s in sessions), dtype=np.int64, count=n)
        pos = np.asarray(
            [np.nan if p is None else float(p) for p in positions] if positions is not None else [np.nan] * n
        )
        key = np.where(np.isnan(pos), times_arr, pos)
        order = np.lexsort((times_arr, key, session))
        prev = np.full(n, -1, dtype=np.int64)
        nxt = np.full(n, -1, dtype=np.int64)
        if n > 1:
            same = session[order[1:]] == session[order[:-1]]
            prev[order[1:][same]] = order[:-1][same]
            nxt[order[:-1][same]] = order[1:][same]
        return cls(
            ids=list(ids),
            texts=list(texts),
            vectors=_matrix(vectors, n),
            session=session,
            session_ids=ordered,
            session_time=np.asarray([first[s] for s in ordered], dtype=np.float64),
            prev=prev,
            next=nxt,
            speakers=np.asarray(
                [(s or "").strip().lower() for s in speakers] if speakers is not None else [""] * n, dtype=object
            ),
            roles=np.asarray([r or "" for r in roles] if roles is not None else [""] * n, dtype=object),
            terms=[(TermMatrix.build(texts), np.arange(n))],
            refs=list(refs) if refs is not None else [(None, i) for i in range(n)],
        )

    def subset(self, keep: np.ndarray) -> Candidates:
        """Return the candidates where ``keep`` is true (sessions and neighbours renumbered among them)."""
        keep = np.asarray(keep, dtype=bool)
        rows = np.flatnonzero(keep)
        remap = np.full(len(self) + 1, -1, dtype=np.int64)  # remap[-1] stays -1
        remap[rows] = np.arange(len(rows))
        used = np.unique(self.session[rows])
        session_code = np.full(self.n_sessions, -1, dtype=np.int64)
        session_code[used] = np.arange(len(used))
        return Candidates(
            ids=[self.ids[i] for i in rows],
            texts=[self.texts[i] for i in rows],
            vectors=self.vectors[rows],
            session=session_code[self.session[rows]],
            session_ids=[self.session_ids[s] for s in used],
            session_time=self.session_time[used],
            prev=remap[self.prev[rows]],
            next=remap[self.next[rows]],
            speakers=self.speakers[rows],
            roles=self.roles[rows],
            terms=[(matrix, remap[pos]) for matrix, pos in self.terms],
            refs=[self.refs[i] for i in rows],
        )


def _matrix(vectors: np.ndarray, n: int) -> np.ndarray:
    out = np.ascontiguousarray(vectors, dtype=np.float32)
    return out if out.ndim == 2 else out.reshape(n, -1) if n else out.reshape(0, 0)


def from_snapshot(snap: Snapshot, kinds: Sequence[str], mask: np.ndarray | None = None) -> Candidates:
    """Return the candidates of a namespace's snapshot: its rows of ``kinds`` (each kind's neighbours among its own
    rows, as the kinds were joined), restricted to ``mask`` (rows of the snapshot) when given."""
    key = f"{DERIVED_KEY}:{','.join(kinds)}"
    whole = snap.derived.get(key)
    if whole is None:
        parts = [_of_kind(snap, kind) for kind in kinds]
        whole = snap.derived[key] = parts[0] if len(parts) == 1 else _concat(parts)
    if mask is None:
        return whole
    keep = mask[[row for _, row in whole.refs]] if len(whole) else np.zeros(0, dtype=bool)
    return whole if keep.all() else whole.subset(keep)


def _of_kind(snap: Snapshot, kind: str) -> Candidates:
    """Return the candidates of one kind's rows of a snapshot (kept in its ``derived`` slot)."""
    key = f"{DERIVED_KEY}:{kind}"
    cached = snap.derived.get(key)
    if cached is not None:
        return cached
    rows_at = np.flatnonzero(snap.kinds == kind)
    rows = snap.rows.take(pa.array(rows_at, pa.int64()))
    metas = [json.loads(m) if m else {} for m in rows.column("meta").to_pylist()]
    created = rows.column("created_at").cast("int64").fill_null(0).to_numpy(zero_copy_only=False)
    cached = snap.derived[key] = Candidates.build(
        ids=rows.column("id").to_pylist(),
        texts=rows.column("text").to_pylist(),
        vectors=snap.vectors[rows_at],
        session_ids=rows.column("session_id").to_pylist(),
        times=created.astype(np.float64),
        positions=[m.get("turn_index") if isinstance(m.get("turn_index"), int | float) else None for m in metas],
        speakers=[m.get("speaker") for m in metas],
        roles=[m.get("role") or kind for m in metas],
        refs=[(snap, int(r)) for r in rows_at],
    )
    return cached


def _concat(parts: Sequence[Candidates]) -> Candidates:
    """Join the candidates of several kinds (sessions merged by id and ordered by their first item; neighbours stay within a kind)."""
    first: dict[str, float] = {}
    for p in parts:
        for s, t in zip(p.session_ids, p.session_time.tolist(), strict=True):
            first[s] = min(first.get(s, t), t)
    names = sorted(first, key=lambda s: (first[s], s))
    code = {s: i for i, s in enumerate(names)}
    offsets = np.cumsum([0] + [len(p) for p in parts])[:-1]

    def shifted(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([np.where(a >= 0, a + off, -1) for a, off in zip(arrays, offsets, strict=True)])

    return Candidates(
        ids=[i for p in parts for i in p.ids],
        texts=[t for p in parts for t in p.texts],
        vectors=np.concatenate([p.vectors for p in parts]),
        session=np.concatenate(
            [np.asarray([code[p.session_ids[c]] for c in p.session], dtype=np.int64) for p in parts]
        ),
        session_ids=names,
        session_time=np.asarray([first[s] for s in names], dtype=np.float64),
        prev=shifted([p.prev for p in parts]),
        next=shifted([p.next for p in parts]),
        speakers=np.concatenate([p.speakers for p in parts]),
        roles=np.concatenate([p.roles for p in parts]),
        terms=[
            (m, np.where(pos >= 0, pos + off, -1)) for p, off in zip(parts, offsets, strict=True) for m, pos in p.terms
        ],
        refs=[r for p in parts for r in p.refs],
    )
