"""LangGraph ``BaseStore`` on LanceDB: long-term memory for any graph and for ``langgraph dev``.

Arbitrary items (profiles, tool memories) live in the ``lg_items``/``lg_vectors``
tables (:mod:`~dualmem.stores._kv`); the facts and insights of the dual
memory appear under ``(memory_label, persona, user, "fact" | "insight")``
(:mod:`~dualmem.stores.memory_view`), backed by the ``DualStore`` at the same
URI (``store.dual``). Every read goes to LanceDB and sees every commit of any
process, so several server workers and ``dualmem ingest`` share one store.

Only ``batch``/``abatch`` are implemented (the base class gives get/put/search/
delete/list_namespaces): a pure core plans the ops, the shells embed (sync or
async), and one executor applies them — reads see the state before the batch,
then writes are applied, as in LangGraph's own stores. ``filter`` takes the
same dicts (equality, nested dicts, ``$eq $ne $gt $gte $lt $lte``). Searches
without a query are ordered newest update first.

TTL (``supports_ttl``): ``put(..., ttl=minutes)`` or ``ttl={"default_ttl": …,
"refresh_on_read": …, "sweep_interval_minutes": …, "omit_expired": …}``;
reads with ``refresh_ttl`` extend an item's expiry; ``sweep_ttl()`` deletes
expired items and ``start_ttl_sweeper()`` does so in a background thread (its
start/stop answers may be awaited, as ``AsyncPostgresStore``'s). Expired
items stay visible until swept unless ``omit_expired`` is set, as in
LangGraph's Postgres store. For ``langgraph.json``: ``"store": {"path":
"./dualmem/stores/langgraph_store.py:make_store", "ttl": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

import dualmem.stores._lance as L
from dualmem.config import Settings
from dualmem.schema import utcnow
from dualmem.stores._coalesce import Coalescer
from dualmem.stores._kv import KVTables, expiry, item_id, value_json
from dualmem.stores._match import matches
from dualmem.stores._sql import ns_key, ns_parse, ns_prefix_sql
from dualmem.stores._sweeper import Stopped, Sweeper, SweeperFuture
from dualmem.stores.memory_view import MemoryView


class _Plan:
    """What a batch will do. A plain class: ``langgraph dev`` may exec this file as an anonymous module."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        self.queries: list[str] = []
        self.texts: list[tuple[str, str, str]] = []  # (item id, path, text)


_OVER_LOCK = threading.Lock()


class LanceDBStore(BaseStore):
    """Persist LangGraph store items in LanceDB, with semantic search, TTL and the dual memory view."""

    supports_ttl = True

    def __init__(
        self,
        uri: str,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        memory_label: str | None = None,
        storage_options: dict[str, str] | str | None = None,
        dual: Any = None,
    ) -> None:
        settings = Settings()
        self.uri = str(uri)
        self.ttl_config: TTLConfig | None = dict(ttl) if ttl else None  # type: ignore[assignment]
        self._options = L.storage_options(storage_options if storage_options is not None else settings.store_options)
        self._db = dual._db if dual is not None else L.connect(self.uri, self._options)
        if index is None and dual is not None:
            index = {"dims": dual.dims, "embed": dual.embeddings, "fields": ["$"]}
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Embeddings | None = None
        if index:
            self.index_config = dict(index)
            self.embeddings = ensure_embeddings(index.get("embed"))
            given: Any = index.get("fields") or dict(index).get("text_fields")  # SQLite's stores call it text_fields
            fields: list[str] = list(given or ["$"])
            self.index_config["__tokenized_fields"] = [(p, tokenize_path(p) if p != "$" else p) for p in fields]
        distance = str((index or {}).get("distance_type") or "cosine")
        self.kv = KVTables(self._db, int(index["dims"]) if index else None, self.uri, distance)
        self._coalescer = Coalescer(self._abatch_now)
        self._dual = dual
        self._dual_lock = threading.Lock()
        self.memory_label = memory_label or settings.memory_label
        self._sweeper = Sweeper(self.sweep_ttl)

    @classmethod
    def from_settings(cls, settings: Settings | None = None, embeddings: Embeddings | None = None, ttl: TTLConfig | None = None) -> LanceDBStore:
        """Open the store at ``settings.store_uri``, indexing whole values with the settings' embedder."""
        from dualmem.stores.dual import DualStore

        s = Settings.resolve(settings)
        return cls(s.store_uri, ttl=ttl, memory_label=s.memory_label, dual=DualStore.from_settings(s, embeddings))

    @classmethod
    def over(cls, dual: Any) -> LanceDBStore:
        """Return the LangGraph store over a ``DualStore`` (its connection and embedder), made once per ``DualStore``:
        opening one checks its tables and indexes, a dozen LanceDB round trips a writer would otherwise pay per history."""
        with _OVER_LOCK:
            found = getattr(dual, "_langgraph_store", None)
            if not isinstance(found, cls):
                found = dual._langgraph_store = cls(dual.uri, dual=dual)
        return found

    @property
    def dual(self) -> Any:
        """Return the ``DualStore`` (facts and insights) at the same URI with the same embedder."""
        with self._dual_lock:
            if self._dual is None:
                from dualmem.errors import ConfigurationError
                from dualmem.stores.dual import DualStore

                if self.embeddings is None:
                    raise ConfigurationError("the dual memory needs embeddings; create LanceDBStore with index=")
                self._dual = DualStore(self.uri, self.embeddings, storage_options=self._options)
            return self._dual

    @property
    def memory(self) -> MemoryView:
        """Return the facts and insights as store items."""
        return MemoryView(self.dual, self.memory_label)

    def _omit_expired(self) -> bool:
        return bool((self.ttl_config or {}).get("omit_expired", False))

    # ------------------------------------------------------------------ shells

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops`` and return one result per op (reads see the store before the batch's writes)."""
        plan = self._plan(ops)
        emb = self.embeddings
        qvecs = [emb.embed_query(q) for q in plan.queries] if emb and plan.queries else []
        dvecs = emb.embed_documents([t for _, _, t in plan.texts]) if emb and plan.texts else []
        return self._execute(plan, qvecs, dvecs)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops`` without blocking the event loop; concurrent calls are merged into one batch."""
        return await self._coalescer.submit(list(ops))

    async def _abatch_now(self, ops: list[Op]) -> list[Result]:
        plan = self._plan(ops)
        emb = self.embeddings
        qvecs = list(await asyncio.gather(*(emb.aembed_query(q) for q in plan.queries))) if emb else []
        dvecs = await emb.aembed_documents([t for _, _, t in plan.texts]) if emb and plan.texts else []
        return await asyncio.to_thread(self._execute, plan, qvecs, dvecs)

    def __enter__(self) -> LanceDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_ttl_sweeper()

    async def __aenter__(self) -> LanceDBStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop_ttl_sweeper()

    # ------------------------------------------------------------------ core

    def _plan(self, ops: Iterable[Op]) -> _Plan:
        plan = _Plan(list(ops))
        for op in plan.ops:
            if isinstance(op, SearchOp):
                if op.query and self.embeddings and op.query not in plan.queries:
                    plan.queries.append(op.query)
            elif isinstance(op, PutOp):
                plan.puts[(tuple(op.namespace), op.key)] = op  # the last write of a key wins
            elif not isinstance(op, GetOp | ListNamespacesOp):
                raise ValueError(f"unknown store operation {type(op).__name__}; expected Get/Put/Search/ListNamespaces")
        if self.index_config:
            for (ns, key), op in plan.puts.items():
                if op.value is None or op.index is False or self._is_memory(ns):
                    continue
                paths = self.index_config["__tokenized_fields"] if op.index is None else [(p, tokenize_path(p)) for p in op.index]
                for path, tokens in paths:
                    texts = get_text_at_path(op.value, tokens)
                    for j, text in enumerate(texts):
                        plan.texts.append((item_id(ns, key), f"{path}.{j}" if len(texts) > 1 else path, text))
        return plan

    def _is_memory(self, namespace: tuple[str, ...]) -> bool:
        return len(namespace) == 4 and namespace[0] == self.memory_label and namespace[3] in ("fact", "insight")

    def _execute(self, plan: _Plan, qvecs: list[list[float]], dvecs: list[list[float]]) -> list[Result]:
        results: list[Result] = [None] * len(plan.ops)
        qmap = dict(zip(plan.queries, qvecs, strict=True))
        refresh: dict[str, dict[str, Any]] = {}
        for i, op in enumerate(plan.ops):
            if isinstance(op, GetOp):
                results[i] = self._get(op, refresh)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op, qmap.get(op.query) if op.query else None, refresh)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op)
        if plan.puts:
            self._apply_puts(plan, dvecs)
        if refresh:
            self.kv.refresh(refresh.values())
        return results

    def _get(self, op: GetOp, refresh: dict[str, dict[str, Any]]) -> Item | None:
        ns = tuple(op.namespace)
        if self._is_memory(ns):
            return self.memory.get(op)
        row = self.kv.by_ids([item_id(ns, op.key)], self._omit_expired()).get(item_id(ns, op.key))
        if row is None:
            return None
        if op.refresh_ttl:
            refresh[row["id"]] = row
        return _to_item(row)

    def _apply_puts(self, plan: _Plan, dvecs: list[list[float]]) -> None:
        kv_puts = {k: op for k, op in plan.puts.items() if not self._is_memory(k[0])}
        for (ns, _), op in plan.puts.items():
            if self._is_memory(ns):
                self.memory.put(op)
        if not kv_puts:
            return
        ids = {k: item_id(*k) for k in kv_puts}
        old = {r["id"]: r["created_at"] for r in self.kv.by_ids(ids.values()).values()}
        now, clock = utcnow(), time.time()
        rows, deleted = [], []
        for (ns, key), op in kv_puts.items():
            iid = ids[(ns, key)]
            if op.value is None:
                deleted.append(iid)
                continue
            ttl = op.ttl
            rows.append(
                {
                    "id": iid, "namespace": ns_key(ns), "key": key, "value": value_json(op.value),
                    "created_at": old.get(iid, now), "updated_at": now,
                    "ttl_minutes": None if ttl is None else float(ttl), "expires_at": expiry(ttl, clock),
                }
            )  # fmt: skip
        nskeys = {iid: ns_key(k[0]) for k, iid in ids.items()}
        vectors = [
            {"id": f"{iid}:{path}", "item_id": iid, "namespace": nskeys[iid], "path": path, "vector": vec}
            for (iid, path, _), vec in zip(plan.texts, dvecs, strict=True)
        ]
        self.kv.write(rows, deleted, vectors, [r["id"] for r in rows])

    def _search(self, op: SearchOp, qvec: list[float] | None, refresh: dict[str, dict[str, Any]]) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        where = ns_prefix_sql(prefix)
        want = op.offset + op.limit
        candidates = self.kv.rows(where, self._omit_expired())
        if op.filter:
            candidates = [r for r in candidates if matches(json.loads(r["value"]), op.filter)]
        memory = self.memory.search(op, qvec, matches) if self.memory_label and self._memory_reachable(prefix) else []
        found: list[tuple[Any, dict[str, Any] | None]]
        if qvec is None or self.kv.vectors is None:
            found = [(_to_item(r, None), r) for r in candidates]
            found += [(m, None) for m in memory]
            found.sort(key=lambda pair: (pair[0].updated_at, pair[0].key), reverse=True)
        else:
            by_id = {r["id"]: r for r in candidates}
            narrowed = op.filter or self._omit_expired()  # rank only the rows that pass, before paging
            scores = self.kv.nearest(where, qvec, want, set(by_id) if narrowed else None)
            scored: list[tuple[Any, dict[str, Any] | None]] = [(_to_item(by_id[i], s), by_id[i]) for i, s in scores.items() if i in by_id]
            scored += [(m, None) for m in memory]
            scored.sort(key=lambda pair: -(pair[0].score if pair[0].score is not None else -2.0))
            found = scored
        page = found[op.offset : want]
        if qvec is not None and self.kv.vectors is not None and len(page) < op.limit:
            shown = {(it.namespace, it.key) for it, _ in found}
            unscored = [r for r in candidates if (ns_parse(r["namespace"]), r["key"]) not in shown]
            unscored.sort(key=lambda r: (r["updated_at"], r["key"]), reverse=True)
            page += [(_to_item(r, None), r) for r in unscored[: op.limit - len(page)]]  # items with nothing indexed
        if op.refresh_ttl:
            refresh.update({row["id"]: row for _, row in page if row is not None})
        return [item for item, _ in page]

    def _memory_reachable(self, prefix: tuple[str, ...]) -> bool:
        if prefix and prefix[0] != self.memory_label:
            return False
        if self.embeddings is None and self._dual is None:
            return False
        return MemoryView.covers(self.memory, prefix)

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = set(self.kv.namespaces(self._omit_expired()))
        if self.embeddings is not None or self._dual is not None:
            namespaces.update(self.memory.namespaces())
        found = list(namespaces)
        for cond in op.match_conditions or ():
            found = [ns for ns in found if _ns_matches(cond, ns)]
        if op.max_depth is not None:
            found = list({ns[: op.max_depth] for ns in found})
        return sorted(found)[op.offset : op.offset + op.limit]

    # ------------------------------------------------------------------ TTL

    def sweep_ttl(self) -> int:
        """Delete every expired item; return how many were deleted."""
        return self.kv.sweep()

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> SweeperFuture:
        """Sweep expired items in a background thread every interval (default: the TTL config's, else 5 min).

        Returns at once, a future done when the sweeper stops; ``await`` on it works too (async callers).
        """
        if not self.ttl_config:
            return SweeperFuture.finished()
        return self._sweeper.start(sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes") or 5)

    def stop_ttl_sweeper(self, timeout: float | None = None) -> Stopped:
        """Stop the background sweeper; true once it has stopped (or none was running); awaitable too."""
        return self._sweeper.stop(timeout)


def make_store() -> LanceDBStore:
    """Return the store ``langgraph dev`` serves (``langgraph.json`` → ``store.path``), built from Settings.

    The ``ttl`` block of ``langgraph.json``'s store config (the server passes it in
    ``LANGGRAPH_STORE``) is honoured, and its sweeper started.
    """
    # the server may exec this file as an anonymous module: build the canonical class
    from dualmem.stores.langgraph_store import LanceDBStore as Store

    config = json.loads(os.environ.get("LANGGRAPH_STORE") or "{}")
    store = Store.from_settings(ttl=config.get("ttl") or None)
    if store.ttl_config:
        store.start_ttl_sweeper()
    return store


# --------------------------------------------------------------------------- helpers


def _to_item(row: dict[str, Any], score: float | None | bool = False) -> Any:
    kwargs = {
        "namespace": ns_parse(row["namespace"]),
        "key": row["key"],
        "value": json.loads(row["value"]),
        "created_at": L.utc(row["created_at"]),
        "updated_at": L.utc(row["updated_at"]),
    }
    if score is False:
        return Item(**kwargs)
    return SearchItem(**kwargs, score=None if score is None else float(score))


def _ns_matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path) if not isinstance(cond.path, str) else (cond.path,)
    if len(ns) < len(path):
        return False
    if cond.match_type not in ("prefix", "suffix"):
        raise ValueError(f"unsupported namespace match type {cond.match_type!r}; use prefix or suffix")
    pairs = zip(ns, path, strict=False) if cond.match_type == "prefix" else zip(ns[::-1], path[::-1], strict=False)
    return all(p == "*" or k == p for k, p in pairs)

