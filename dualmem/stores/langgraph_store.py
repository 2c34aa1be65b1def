"""LangGraph ``BaseStore`` on LanceDB: long-term memory for any graph and for ``langgraph dev``.

Mapping: every BaseStore item is one row of the ``lg_items`` table (stable id
from namespace + key, the namespace as its JSON-array string, the key, the
value as JSON, created/updated time); with an ``index`` config each indexed
text of an item is one row of ``lg_vectors`` (item id, field path, vector),
and a semantic search max-pools an item's field scores like LangGraph's
``InMemoryStore``. The facts/insights of the dual memory live in the
``DualStore`` tables at the same URI (``store.dual``); this view keeps
arbitrary agent values (profiles, tool memories) and never touches them.

Only ``batch``/``abatch`` are implemented (the base class gives get/put/search/
delete/list_namespaces): a pure core plans the ops, the shells embed (sync or
async), and one executor applies them — reads see the state before the batch,
then writes are applied, as in ``InMemoryStore``. ``filter`` takes the same
dicts as ``InMemoryStore`` (equality, nested dicts, ``$eq $ne $gt $gte $lt
$lte``). Searches without a query are ordered newest update first.

For ``langgraph.json``: ``"store": {"path": "./dualmem/stores/langgraph_store.py:make_store"}``;
the server calls ``make_store()`` (or enters it as a context manager).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
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
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.schema import stable_id, utcnow
from dualmem.stores import _lance as L
from dualmem.stores import memory_view

ITEMS, VECTORS = "lg_items", "lg_vectors"
_TS = pa.timestamp("us", tz="UTC")
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("namespace", pa.string()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("created_at", _TS),
        pa.field("updated_at", _TS),
    ]
)
_ITEM_COLS = ["id", "namespace", "key", "value", "created_at", "updated_at"]


def _vectors_schema(dims: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("item_id", pa.string()),
            pa.field("namespace", pa.string()),
            pa.field("path", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dims)),
        ]
    )


def _item_id(namespace: Sequence[str], key: str) -> str:
    return stable_id(L.ns_key(namespace), key, prefix="kv-")


class _Plan:
    """What a batch will do: reads (by op index) and the last write per (namespace, key).

    A plain class, not a dataclass: ``langgraph dev`` execs this file under a module name
    missing from ``sys.modules``, where ``@dataclass`` with postponed annotations fails.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.gets: dict[int, GetOp] = {}
        self.searches: dict[int, SearchOp] = {}
        self.lists: dict[int, ListNamespacesOp] = {}
        self.puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        self.queries: list[str] = []
        self.texts: list[tuple[str, str, str]] = []  # (item id, path, text)
        self.memory: dict[int, Op] = {}  # ops on ("dualmem", …) namespaces: the dual memory


class LanceDBStore(BaseStore):
    """Persist LangGraph store items in LanceDB, with optional semantic search."""

    supports_ttl = False

    def __init__(self, uri: str, *, index: IndexConfig | None = None) -> None:
        self.uri = str(uri)
        self._db = L.connect(self.uri)
        self._lock = threading.RLock()
        self._items = L.open_or_create(self._db, ITEMS, ITEMS_SCHEMA)
        self._ensure_indexes(self._items, {"id": "BTREE", "namespace": "BITMAP"})
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Embeddings | None = None
        self._vectors: Any = None
        if index:
            self.index_config = dict(index)
            self.embeddings = ensure_embeddings(index.get("embed"))
            fields = index.get("fields") or ["$"]
            self.index_config["__tokenized_fields"] = [(p, tokenize_path(p) if p != "$" else p) for p in fields]
            self._vectors = L.open_or_create(self._db, VECTORS, _vectors_schema(int(index["dims"])))
            L.check_dims(self._vectors, "vector", int(index["dims"]), self.uri)
            self._ensure_indexes(self._vectors, {"item_id": "BTREE", "namespace": "BITMAP"})
        self._dual: Any = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None, embeddings: Embeddings | None = None) -> LanceDBStore:
        """Open the store at ``settings.store_uri``, indexing whole values with the settings' embedder."""
        from dualmem.models import embedding_dims, load_embeddings

        settings = Settings.resolve(settings)
        emb = load_embeddings(embeddings, settings)
        return cls(settings.store_uri, index={"dims": embedding_dims(emb), "embed": emb, "fields": ["$"]})

    @property
    def dual(self) -> Any:
        """Return the ``DualStore`` (facts and insights) at the same URI with the same embedder."""
        if self._dual is None:
            from dualmem.stores.dual import DualStore

            if self.embeddings is None:
                raise ConfigurationError("the dual store needs embeddings; create LanceDBStore with index=")
            self._dual = DualStore(self.uri, self.embeddings)
        return self._dual

    # ------------------------------------------------------------------ shells

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops`` in order and return one result per op."""
        plan = self._plan(ops)
        emb = self.embeddings
        qvecs = [emb.embed_query(q) for q in plan.queries] if emb and plan.queries else []
        dvecs = emb.embed_documents([t for _, _, t in plan.texts]) if emb and plan.texts else []
        return self._execute(plan, qvecs, dvecs)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops`` in order without blocking the event loop."""
        plan = self._plan(ops)
        emb = self.embeddings
        qvecs = list(await asyncio.gather(*(emb.aembed_query(q) for q in plan.queries))) if emb else []
        dvecs = await emb.aembed_documents([t for _, _, t in plan.texts]) if emb and plan.texts else []
        return await asyncio.to_thread(self._execute, plan, qvecs, dvecs)

    def __enter__(self) -> LanceDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> LanceDBStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    # ------------------------------------------------------------------ core

    def _plan(self, ops: Iterable[Op]) -> _Plan:
        ops = list(ops)
        plan = _Plan(size=len(ops))
        for i, op in enumerate(ops):
            ns = getattr(op, "namespace_prefix", getattr(op, "namespace", None))
            if ns is not None and memory_view.is_memory_namespace(tuple(ns)):
                plan.memory[i] = op
            elif isinstance(op, GetOp):
                plan.gets[i] = op
            elif isinstance(op, SearchOp):
                plan.searches[i] = op
                if op.query and self.embeddings and op.query not in plan.queries:
                    plan.queries.append(op.query)
            elif isinstance(op, ListNamespacesOp):
                plan.lists[i] = op
            elif isinstance(op, PutOp):
                plan.puts[(tuple(op.namespace), op.key)] = op
            else:
                raise ValueError(f"unknown store operation {type(op).__name__}; expected Get/Put/Search/ListNamespaces")
        if self.index_config:
            for op in plan.puts.values():
                if op.value is None or op.index is False:
                    continue
                paths = (
                    self.index_config["__tokenized_fields"]
                    if op.index is None
                    else [(p, tokenize_path(p)) for p in op.index]
                )
                iid = _item_id(op.namespace, op.key)
                for path, tokens in paths:
                    texts = get_text_at_path(op.value, tokens)
                    for j, text in enumerate(texts):
                        plan.texts.append((iid, f"{path}.{j}" if len(texts) > 1 else path, text))
        return plan

    def _execute(self, plan: _Plan, qvecs: list[list[float]], dvecs: list[list[float]]) -> list[Result]:
        results: list[Result] = [None] * plan.size
        qmap = dict(zip(plan.queries, qvecs, strict=True))
        with self._lock:
            if plan.gets:
                ids = {i: _item_id(op.namespace, op.key) for i, op in plan.gets.items()}
                rows = {r["id"]: r for r in L.query_rows(self._items, L.sql_in("id", set(ids.values())), _ITEM_COLS)}
                for i, iid in ids.items():
                    results[i] = _to_item(rows[iid]) if iid in rows else None
            for i, search in plan.searches.items():
                results[i] = self._search(search, qmap.get(search.query) if search.query else None)
            for i, listing in plan.lists.items():
                results[i] = self._list_namespaces(listing)
            if plan.puts:
                self._apply_puts(plan, dvecs)
            for i, op in plan.memory.items():
                results[i] = memory_view.execute(self.dual, op, _matches)  # type: ignore[arg-type]
        return results

    def _apply_puts(self, plan: _Plan, dvecs: list[list[float]]) -> None:
        ids = {k: _item_id(*k) for k in plan.puts}
        all_ids = list(ids.values())
        old = {
            r["id"]: r["created_at"] for r in L.query_rows(self._items, L.sql_in("id", all_ids), ["id", "created_at"])
        }
        now = utcnow()
        rows, deleted = [], []
        for (ns, key), op in plan.puts.items():
            iid = ids[(ns, key)]
            if op.value is None:
                deleted.append(iid)
                continue
            value = json.dumps(op.value, ensure_ascii=False, default=str)
            rows.append(
                {
                    "id": iid,
                    "namespace": L.ns_key(ns),
                    "key": key,
                    "value": value,
                    "created_at": old.get(iid, now),
                    "updated_at": now,
                }
            )
        if deleted:
            self._items.delete(L.sql_in("id", deleted))
        if rows:
            data = pa.Table.from_pylist(rows, schema=ITEMS_SCHEMA)
            self._items.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
        if self._vectors is not None:
            self._vectors.delete(L.sql_in("item_id", all_ids))
            nskeys = {ids[k]: L.ns_key(k[0]) for k in plan.puts}
            vrows = [
                {"id": f"{iid}:{path}", "item_id": iid, "namespace": nskeys[iid], "path": path, "vector": vec}
                for (iid, path, _), vec in zip(plan.texts, dvecs, strict=True)
            ]
            if vrows:
                self._vectors.add(pa.Table.from_pylist(vrows, schema=self._vectors.schema))

    def _search(self, op: SearchOp, qvec: list[float] | None) -> list[SearchItem]:
        where = L.ns_prefix_sql(op.namespace_prefix)
        want = op.offset + op.limit
        if qvec is None or self._vectors is None:
            rows = self._candidates(where, op.filter)
            rows.sort(key=lambda r: (r["updated_at"], r["key"]), reverse=True)
            return [_to_item(r, None) for r in rows[op.offset : want]]
        if op.filter:
            rows = self._candidates(where, op.filter)
            scores = self._score_ids({r["id"] for r in rows}, qvec)
            by_id = {r["id"]: r for r in rows}
        else:
            scores = self._nearest(where, qvec, want)
            by_id = {}
        ranked = sorted(scores, key=lambda i: -scores[i])[op.offset : want]
        if not op.filter and ranked:
            by_id = {r["id"]: r for r in L.query_rows(self._items, L.sql_in("id", ranked), _ITEM_COLS)}
        out = [_to_item(by_id[i], scores[i]) for i in ranked if i in by_id]
        if len(out) < op.limit:  # items with nothing indexed come last, without a score
            rest = [
                r for r in (by_id.values() if op.filter else self._candidates(where, None)) if r["id"] not in scores
            ]
            out.extend(_to_item(r, None) for r in rest[: op.limit - len(out)])
        return out

    def _candidates(self, where: str | None, filt: dict[str, Any] | None) -> list[dict[str, Any]]:
        rows = L.query_rows(self._items, where, _ITEM_COLS)
        if filt:
            rows = [r for r in rows if _matches(json.loads(r["value"]), filt)]
        return rows

    def _nearest(self, where: str | None, qvec: list[float], want: int) -> dict[str, float]:
        fetch = max(want * 2, 20)
        while True:
            query = self._vectors.search(list(qvec), vector_column_name="vector").distance_type("cosine")
            if where:
                query = query.where(where, prefilter=True)
            rows = query.select(["item_id", "_distance"]).limit(fetch).to_arrow().to_pylist()
            scores: dict[str, float] = {}
            for r in rows:  # max-pool an item's field scores (rows come best first)
                scores.setdefault(r["item_id"], 1.0 - r["_distance"])
            if len(scores) >= want or len(rows) < fetch:
                return scores
            fetch *= 4

    def _score_ids(self, ids: set[str], qvec: list[float]) -> dict[str, float]:
        if not ids:
            return {}
        rows = L.query_rows(self._vectors, L.sql_in("item_id", ids), ["item_id", "vector"])
        if not rows:
            return {}
        mat = np.asarray([r["vector"] for r in rows], dtype=np.float32)
        q = np.asarray(qvec, dtype=np.float32)
        sims = mat @ q / np.maximum(np.linalg.norm(mat, axis=1) * np.linalg.norm(q), 1e-12)
        scores: dict[str, float] = {}
        for r, s in zip(rows, sims.tolist(), strict=True):
            scores[r["item_id"]] = max(scores.get(r["item_id"], -2.0), s)
        return scores

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        col = self._items.search().select(["namespace"]).limit(None).to_arrow().column("namespace")
        namespaces = [L.ns_parse(k) for k in col.unique().to_pylist()]
        if self.embeddings is not None:
            namespaces += memory_view.namespaces(self.dual)
        for cond in op.match_conditions or ():
            namespaces = [ns for ns in namespaces if _ns_matches(cond, ns)]
        if op.max_depth is not None:
            namespaces = list({ns[: op.max_depth] for ns in namespaces})
        return sorted(namespaces)[op.offset : op.offset + op.limit]

    @staticmethod
    def _ensure_indexes(table: Any, wanted: dict[str, str]) -> None:
        from lancedb.index import Bitmap, BTree

        have = {tuple(i.columns) for i in table.list_indices()}
        for column, kind in wanted.items():
            if (column,) not in have:
                table.create_index(column, config=BTree() if kind == "BTREE" else Bitmap())


def make_store() -> LanceDBStore:
    """Return the store ``langgraph dev`` serves (``langgraph.json`` → ``store.path``), built from Settings."""
    # the server may exec this file as an anonymous module: build the canonical class
    from dualmem.stores.langgraph_store import LanceDBStore as Store

    return Store.from_settings()


# --------------------------------------------------------------------------- helpers


def _to_item(row: dict[str, Any], score: float | None | bool = False) -> Any:
    kwargs = {
        "namespace": L.ns_parse(row["namespace"]),
        "key": row["key"],
        "value": json.loads(row["value"]),
        "created_at": L.utc(row["created_at"]),
        "updated_at": L.utc(row["updated_at"]),
    }
    if score is False:
        return Item(**kwargs)
    return SearchItem(**kwargs, score=None if score is None else float(score))


def _ns_matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    if cond.match_type not in ("prefix", "suffix"):
        raise ValueError(f"unsupported namespace match type {cond.match_type!r}; use prefix or suffix")
    pairs = zip(ns, path, strict=False) if cond.match_type == "prefix" else zip(ns[::-1], path[::-1], strict=False)
    return all(p == "*" or k == p for k, p in pairs)


_OPS = {
    "$eq": lambda a, b: a == b,
    "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: a is not None and float(a) > float(b),
    "$gte": lambda a, b: a is not None and float(a) >= float(b),
    "$lt": lambda a, b: a is not None and float(a) < float(b),
    "$lte": lambda a, b: a is not None and float(a) <= float(b),
}


def _matches(value: Any, filt: dict[str, Any]) -> bool:
    """Return True if ``value`` (a dict) satisfies the filter dict, as ``InMemoryStore`` does."""
    return isinstance(value, dict) and all(_compare(value.get(k), v) for k, v in filt.items())


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            for op, arg in wanted.items():
                if op not in _OPS:
                    raise ValueError(f"unsupported filter operator {op!r}; use one of {sorted(_OPS)}")
                if not _OPS[op](actual, arg):
                    return False
            return True
        return _matches(actual, wanted)
    if isinstance(wanted, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted
