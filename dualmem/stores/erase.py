"""Erase data from LanceDB folders for good: which tables hold a namespace's rows, deleting them, scrubbing an item
from the ledger's plans, clearing lease names, and purging the bytes (:mod:`~dualmem.stores.purge`).

A folder is one LanceDB database: the store itself (``name`` "") or a baseline framework's folder
(``{store_uri}/{framework}``). Its tables, as far as a namespace's data goes:

- ``memory`` — rows of a namespace (facts, insights, their version rows), keyed by ``pk``;
- ``chunk_ledger`` — the namespace's units of work (:mod:`~dualmem.stores.ledger`), keyed by ``id``;
- ``lg_items`` / ``lg_vectors`` — LangGraph store items and their vectors (:mod:`~dualmem.stores.kv`), keyed by ``id``;
- ``namespace_leases`` — the namespace's lease row; ``write_leases`` — its name on a creation slot
  (:mod:`~dualmem.stores.leases`).

Every delete is by a caller's SQL over the ``namespace`` column (or keys); this module names the tables, so
nothing outside :mod:`dualmem.stores` does. The fragments that held deleted or rewritten rows are collected in a
:data:`Frags` map and purged once, at the end (:func:`purge_all`): no grace period, see :mod:`~dualmem.stores.purge`.
:meth:`LanceDualStore.forget_namespace <dualmem.stores.lance.LanceDualStore.forget_namespace>` and ``forget_item``
use these steps on the store's own folder; :mod:`dualmem.control.forget` on the store and every framework folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dualmem.stores._lance as L
from dualmem.memory.versions import VERSION_OF
from dualmem.stores import leases as _leases
from dualmem.stores import ledger as _ledger
from dualmem.stores._kv_schema import ITEMS, VECTORS
from dualmem.stores._sql import and_all, ns_eq_sql, ns_key, ns_parse, sql_in, sql_str
from dualmem.stores.purge import fragments, purge

MEMORY, LEDGER = "memory", _ledger.TABLE
LEASES, NS_LEASES = _leases.TABLE, _leases.NS_TABLE
KEYS = {MEMORY: "pk", LEDGER: "id", ITEMS: "id", VECTORS: "id"}
"""The data tables a namespace's rows are deleted from, with each one's key column."""
REWRITE = {
    MEMORY: "status",
    LEDGER: "state",
    ITEMS: "namespace",
    VECTORS: "namespace",
    LEASES: "namespace",
    NS_LEASES: "holder",
}
"""Per table, the (non-key) column a purge sets to itself to move a fragment's rows into a new one."""

Frags = dict[tuple[str, str], set[int]]
"""The fragments to purge: ``(folder name, table) -> fragment ids``."""


@dataclass
class Folder:
    """One LanceDB database holding DualMem tables: the store (``name`` "") or a framework's folder."""

    name: str
    uri: str
    db: Any
    tables: list[str] = field(default_factory=list)

    @property
    def main(self) -> bool:
        """True for the store itself."""
        return not self.name

    @property
    def has_memory(self) -> bool:
        """True if the folder holds a memory table."""
        return MEMORY in self.tables

    @property
    def has_leases(self) -> bool:
        """True if writers took leases in this folder."""
        return LEASES in self.tables

    def table(self, name: str) -> Any:
        """Return an open table of this folder."""
        return self.db.open_table(name)

    def label(self) -> str:
        """Return how reports name this folder."""
        return "store" if self.main else self.name


def _exists(uri: str) -> bool:
    """Return True unless ``uri`` is a local folder that does not exist (object storage: listed, not created)."""
    if "://" in uri and not uri.startswith("file://"):
        return True
    return Path(uri.split("://", 1)[-1]).expanduser().is_dir()


def open_folders(uri: str, options: Mapping[str, str] | None, subfolders: Sequence[str] = ()) -> list[Folder]:
    """Return the store at ``uri`` and each of its ``subfolders`` that holds tables (nothing is created)."""
    found = []
    for name in ("", *subfolders):
        where = uri if not name else f"{uri.rstrip('/')}/{name}"
        if not _exists(where):
            continue
        db = L.connect(where, options)
        tables = L.table_names(db)
        if tables:
            found.append(Folder(name, where, db, tables))
    return found


def folder_of(db: Any, uri: str) -> Folder:
    """Return a store's own folder (its open LanceDB connection)."""
    return Folder("", uri, db, L.table_names(db))


# --------------------------------------------------------------------------- reading


def _rows(folder: Folder, table: str, where: str, columns: list[str]) -> list[dict[str, Any]]:
    return L.query_rows(folder.table(table), where, columns) if table in folder.tables else []


def memory_rows(folder: Folder, where: str, columns: list[str]) -> list[dict[str, Any]]:
    """Return the memory rows ``where`` selects (nothing when the folder has no memory table)."""
    return _rows(folder, MEMORY, where, columns)


def memory_namespaces(folder: Folder, where: str) -> list[tuple[str, ...]]:
    """Return the namespaces of the memory rows ``where`` selects, sorted."""
    return sorted({ns_parse(r["namespace"]) for r in memory_rows(folder, where, ["namespace"])})


def ledger_count(folder: Folder, where: str) -> int:
    """Return how many ledger rows ``where`` selects."""
    return len(_rows(folder, LEDGER, where, ["id"]))


def kv_namespaces(folder: Folder) -> list[tuple[str, ...]]:
    """Return every namespace the folder's LangGraph store items and vectors use."""
    keys: set[str] = set()
    for name in (ITEMS, VECTORS):
        if name in folder.tables:
            keys.update(L.scan(folder.table(name), None, ["namespace"]).column("namespace").unique().to_pylist())
    return [ns_parse(k) for k in sorted(keys)]


def kv_count(folder: Folder, namespaces: Sequence[Sequence[str]]) -> int:
    """Return how many LangGraph store items the folder holds under ``namespaces``."""
    return len(_rows(folder, ITEMS, sql_in("namespace", [ns_key(ns) for ns in namespaces]), ["id"]))


# --------------------------------------------------------------------------- deleting


def delete(folder: Folder, table: str, where: str, frags: Frags) -> int:
    """Delete the rows ``where`` selects from a data table (noting their fragments in ``frags``); return how many."""
    if table not in folder.tables or where == "FALSE":
        return 0
    t = folder.table(table)
    found = fragments(t, where, KEYS[table])
    if not found:
        return 0
    frags.setdefault((folder.name, table), set()).update(found)
    return int(L.retry(lambda: t.delete(where)).num_deleted_rows)


def delete_rows(
    folder: Folder, memory_where: str, kv_namespaces: Sequence[Sequence[str]], frags: Frags
) -> dict[str, int]:
    """Delete the memory and ledger rows ``memory_where`` selects and the LangGraph store rows of ``kv_namespaces``
    from every data table of the folder; return the rows gone per ``folder/table``."""
    kv_sql = sql_in("namespace", [ns_key(ns) for ns in kv_namespaces])
    return {
        f"{folder.label()}/{table}": delete(folder, table, memory_where if table in (MEMORY, LEDGER) else kv_sql, frags)
        for table in KEYS
    }


def delete_memory(folder: Folder, where: str, frags: Frags) -> int:
    """Delete the memory rows ``where`` selects; return how many."""
    return delete(folder, MEMORY, where, frags)


def scrub(value: Any, ids: set[str]) -> Any:
    """Return a ledger payload without anything about ``ids``: records and rows naming them, vectors keyed by them."""
    if isinstance(value, list):
        return [scrub(v, ids) for v in value if not _about(v, ids)]
    if isinstance(value, dict):
        return {k: scrub(v, ids) for k, v in value.items() if k not in ids}
    return value


def _about(value: Any, ids: set[str]) -> bool:
    if not isinstance(value, dict):
        return False
    named = {value.get(k) for k in ("id", "store_id", "into")} | {(value.get("meta") or {}).get(VERSION_OF)}
    return bool(named & ids)


def scrub_ledger(folder: Folder, namespace: Sequence[str], ids: set[str], frags: Frags) -> int:
    """Remove ``ids`` from the plans of the namespace's ledger rows (the dialogue stays); return how many rows changed."""
    if LEDGER not in folder.tables:
        return 0
    ledger = folder.table(LEDGER)
    touched = [
        r
        for r in _rows(folder, LEDGER, ns_eq_sql(namespace), ["id", "payload"])
        if any(i in (r["payload"] or "") for i in ids)
    ]
    for row in touched:
        where = f"id = {sql_str(row['id'])}"
        frags.setdefault((folder.name, LEDGER), set()).update(fragments(ledger, where, "id"))
        text = json.dumps(scrub(json.loads(row["payload"]), ids), default=str)
        L.retry(lambda w=where, t=text: ledger.update(where=w, values={"payload": t}))  # type: ignore[misc]
    return len(touched)


def forget_item_rows(
    folder: Folder, namespace: Sequence[str], pks: Sequence[str], item: str, frags: Frags
) -> dict[str, int]:
    """Delete an item's rows (``pks``: the item and its version rows) and scrub it from the ledger's plans; return
    the rows gone and the ledger rows changed, per ``folder/table``."""
    ids = {r["id"] for r in memory_rows(folder, sql_in("pk", list(pks)), ["id"])} | {item}
    gone = delete_memory(folder, and_all(ns_eq_sql(namespace), sql_in("pk", list(pks))) or "FALSE", frags)
    out = {f"{folder.label()}/{MEMORY}": gone}
    if LEDGER in folder.tables:
        out[f"{folder.label()}/{LEDGER} (plans scrubbed)"] = scrub_ledger(folder, namespace, ids, frags)
    return out


def item_rows(folder: Folder, namespace: Sequence[str], item: str) -> list[dict[str, Any]]:
    """Return the memory rows of an item of ``namespace``: the item and its version rows (``pk``, ``id``, ``meta``)."""
    rows = memory_rows(folder, ns_eq_sql(namespace), ["pk", "id", "meta"])
    return [r for r in rows if r["id"] == item or json.loads(r["meta"] or "{}").get(VERSION_OF) == item]


# --------------------------------------------------------------------------- leases and bytes


def lease_tables(folder: Folder, ttl_s: float, wait_s: float) -> Any:
    """Return the folder's write leases (:class:`~dualmem.stores.leases.Leases`), None where no writer took one."""
    return _leases.Leases(folder.db, ttl_s=ttl_s, wait_s=wait_s) if folder.has_leases else None


def release_names(
    folder: Folder, namespaces: Sequence[Sequence[str]], unverified: bool = False
) -> dict[str, dict[str, int]]:
    """Clear ``namespaces``' names from free lease slots, delete their free lease rows, and purge those rows' old
    versions; return what each purge did, per ``folder/table``."""
    purged: dict[str, dict[str, int]] = {}
    if not folder.has_leases:
        return purged
    keys = [ns_key(ns) for ns in namespaces]
    for name in (LEASES, NS_LEASES):  # a Leases object made NS_LEASES if the folder lacked it
        table = folder.table(name)
        where = and_all(sql_in("namespace", keys), "holder = ''") or "FALSE"
        found = fragments(table, where, "namespace")
        if found:
            if name == NS_LEASES:
                L.retry(lambda t=table, w=where: t.delete(w))  # type: ignore[misc]
            else:
                L.retry(lambda t=table, w=where: t.update(where=w, values={"namespace": ""}))  # type: ignore[misc]
            purged[f"{folder.label()}/{name}"] = purge(table, found, REWRITE[name], delete_unverified=unverified)
    return purged


def purge_all(folders: Sequence[Folder], frags: Frags, unverified: bool = False) -> dict[str, dict[str, int]]:
    """Purge every table that lost rows (``frags``): fragments rewritten, indexes rebuilt, old versions dropped."""
    by_name = {f.name: f for f in folders}
    return {
        f"{by_name[name].label()}/{table}": purge(
            by_name[name].table(table), found, REWRITE[table], delete_unverified=unverified
        )
        for (name, table), found in sorted(frags.items())
    }


def forget_namespace(folder: Folder, namespace: Sequence[str], unverified: bool = False) -> dict[str, int]:
    """Delete a namespace's memory and ledger rows and purge their bytes (hold its write lease meanwhile); return
    ``{"items": n, "ledger": n}``. Its lease row goes with :func:`release_names`, once the lease is free."""
    frags: Frags = {}
    gone = {table: delete(folder, table, ns_eq_sql(tuple(namespace)), frags) for table in (MEMORY, LEDGER)}
    purge_all([folder], frags, unverified)
    return {"items": gone[MEMORY], "ledger": gone[LEDGER]}


def forget_item(folder: Folder, namespace: Sequence[str], item: str, unverified: bool = False) -> dict[str, int]:
    """Delete an item's rows and its version rows, scrub it from the ledger's plans and purge the bytes (hold the
    namespace's write lease meanwhile); return ``{"items": rows gone, "ledger": plans scrubbed}``."""
    frags: Frags = {}
    pks = [r["pk"] for r in item_rows(folder, namespace, item)]
    done = forget_item_rows(folder, namespace, pks, item, frags) if pks else {}
    purge_all([folder], frags, unverified)
    label = folder.label()
    return {"items": done.get(f"{label}/{MEMORY}", 0), "ledger": done.get(f"{label}/{LEDGER} (plans scrubbed)", 0)}
