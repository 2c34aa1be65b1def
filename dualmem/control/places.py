"""Where a user's memory lives: the store folders, the rows of each table that belong to a namespace, the threads.

A memory namespace is exactly ``(persona, user)``. Its data, at a store URI:

- **the store** (``store_uri``): table ``memory`` — rows of namespace ``(persona, user)``
  (facts, insights, their version rows); ``chunk_ledger`` — its rows;
  ``lg_items`` / ``lg_vectors`` — LangGraph store items under
  ``(memory_label, persona, user, …)`` (items beside the facts and insights) and
  ``("dualmem_pending", persona, user, thread)`` (chat turns waiting for memory
  formation, and each chat thread's record); ``namespace_leases`` — the namespace's
  lease row (``write_leases``: its name on a slot, written by earlier versions);
- **each baseline framework's folder** (``{store_uri}/{framework}``): the same tables, where
  records live under ``(persona, user)`` and ``(persona, user, collection)`` and every
  key-value namespace is ``(label, persona, user, …)`` (the framework's values; langmem's
  memories, ledger and sources);
- **threads**: a chat thread records its namespace under ``dualmem_pending`` when it
  hands turns to memory formation, and that record stays after its turns are written;
  these threads (and those a checkpoint's metadata names, :mod:`~dualmem.control.checkpoints`)
  are the user's threads.

Matching is exact on every namespace part (never a prefix of a part), so nothing
of another namespace is selected; SQL is built from quoted literals only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import dualmem.stores._lance as L
from dualmem.frameworks import REGISTRY
from dualmem.stores._sql import ns_key, ns_parse, ns_prefix_sql, sql_in
from dualmem.writer.pending import PENDING_LABEL, label

KEYS = {"memory": "pk", "chunk_ledger": "id", "lg_items": "id", "lg_vectors": "id"}
"""The data tables a namespace's rows are deleted from, with each one's key column."""
LEASES = "write_leases"
NS_LEASES = "namespace_leases"
REWRITE = {
    "memory": "status",
    "chunk_ledger": "state",
    "lg_items": "namespace",
    "lg_vectors": "namespace",
    LEASES: "namespace",
    NS_LEASES: "holder",
}
"""Per table, the (non-key) column a purge sets to itself to move a fragment's rows into a new one."""
FRAMEWORK_FOLDERS = tuple(
    name for name in REGISTRY if name != "dualmem"
)  # dualmem keeps its memory in the store itself


@dataclass(frozen=True)
class Target:
    """What to forget: one user of a persona, every user of it (``user`` None), or one item of one user."""

    persona: str
    user: str | None = None
    item: str | None = None

    def describe(self) -> str:
        """Return the target in words."""
        who = (
            f"user {self.user!r} of persona {self.persona!r}"
            if self.user is not None
            else f"every user of persona {self.persona!r}"
        )
        return f"item {self.item!r} of {who}" if self.item else who


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


def open_folders(uri: str, options: Mapping[str, str] | None) -> list[Folder]:
    """Return the store and every framework folder under it that holds tables (nothing is created)."""
    found = []
    for name in ("", *FRAMEWORK_FOLDERS):
        where = uri if not name else f"{uri.rstrip('/')}/{name}"
        if not _exists(where):
            continue
        db = L.connect(where, options)
        tables = L.table_names(db)
        if tables:
            found.append(Folder(name, where, db, tables))
    return found


# --------------------------------------------------------------------------- which rows belong to a target


def memory_where(target: Target) -> str:
    """Return the SQL selecting a target's rows of a ``memory`` or ``chunk_ledger`` table (its namespaces and below)."""
    prefix = (target.persona,) if target.user is None else (target.persona, target.user)
    return ns_prefix_sql(prefix) or "FALSE"


def owns_kv(namespace: Sequence[str], target: Target, labels: Mapping[str, bool] | None) -> bool:
    """Return True if a LangGraph store namespace belongs to ``target``: ``(label, persona, user, …)``.

    ``labels`` maps the labels that may head a user's namespaces to whether their parts are
    percent-encoded (``dualmem_pending``); None accepts any label (a framework's folder).
    """
    ns = tuple(namespace)
    if len(ns) < 3 or (labels is not None and ns[0] not in labels):
        return False
    encoded = bool(labels and labels.get(ns[0]))
    persona = label(target.persona) if encoded else target.persona
    if ns[1] != persona:
        return False
    return target.user is None or ns[2] == (label(target.user) if encoded else target.user)


def store_labels(memory_label: str) -> dict[str, bool]:
    """Return the labels heading a user's LangGraph store namespaces in the store (label -> parts encoded)."""
    return {memory_label: False, PENDING_LABEL: True}


def kv_namespaces(folder: Folder) -> list[tuple[str, ...]]:
    """Return every namespace the folder's LangGraph store items and vectors use."""
    keys: set[str] = set()
    for name in ("lg_items", "lg_vectors"):
        if name in folder.tables:
            keys.update(L.scan(folder.table(name), None, ["namespace"]).column("namespace").unique().to_pylist())
    return [ns_parse(k) for k in sorted(keys)]


def kv_where(folder: Folder, target: Target, memory_label: str) -> tuple[str, list[tuple[str, ...]]]:
    """Return the SQL selecting a target's LangGraph store rows of the folder, and the namespaces it names."""
    labels = store_labels(memory_label) if folder.main else None
    owned = [ns for ns in kv_namespaces(folder) if owns_kv(ns, target, labels)]
    return sql_in("namespace", [ns_key(ns) for ns in owned]), owned


def user_of(namespace: Sequence[str], folder: Folder, kind: str) -> str | None:
    """Return the user part of a namespace selected for a persona (``kind``: ``memory`` or ``kv``)."""
    ns = tuple(namespace)
    if kind == "memory":
        return ns[1] if len(ns) >= 2 else None
    return unquote(ns[2]) if folder.main and ns[0] == PENDING_LABEL else ns[2]


def threads_of(owned: Sequence[tuple[str, ...]]) -> list[str]:
    """Return the chat threads among a target's store namespaces (``dualmem_pending`` records)."""
    return sorted({unquote(ns[3]) for ns in owned if len(ns) == 4 and ns[0] == PENDING_LABEL})


def lease_namespaces(folder: Folder, users: Sequence[str], persona: str) -> list[tuple[str, ...]]:
    """Return the namespaces whose write leases a forget holds in a folder (writers hold these while writing)."""
    if folder.name == "langmem":
        return [("langmem", persona, u) for u in users]
    return [(persona, u) for u in users]
