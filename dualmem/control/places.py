"""Where a user's memory lives: the store folders, the namespaces that belong to a user, the threads.

A memory namespace is exactly ``(persona, user)``. Its data, at a store URI:

- **the store** (``store_uri``): the memory rows of namespace ``(persona, user)``
  (facts, insights, their version rows) and its ledger rows; LangGraph store items under
  ``(memory_label, persona, user, …)`` (items beside the facts and insights) and
  ``("dualmem_pending", persona, user, thread)`` (chat turns waiting for memory
  formation, and each chat thread's record); the namespace's write lease;
- **each baseline framework's folder** (``{store_uri}/{framework}``): the same kinds of data, where
  records live under ``(persona, user)`` and ``(persona, user, collection)`` and every
  key-value namespace is ``(label, persona, user, …)`` (the framework's values; langmem's
  memories, ledger and sources);
- **threads**: a chat thread records its namespace under ``dualmem_pending`` when it
  hands turns to memory formation, and that record stays after its turns are written;
  these threads (and those a checkpoint's metadata names, :mod:`~dualmem.control.checkpoints`)
  are the user's threads.

Matching is exact on every namespace part (never a prefix of a part), so nothing
of another namespace is selected; SQL is built from quoted literals only.

Which tables hold each kind, and deleting it, is :mod:`dualmem.stores.erase`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from dualmem.chat.pending import PENDING_LABEL, label
from dualmem.frameworks import REGISTRY
from dualmem.stores import erase
from dualmem.stores._sql import ns_prefix_sql
from dualmem.stores.erase import Folder

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


def open_folders(uri: str, options: Mapping[str, str] | None) -> list[Folder]:
    """Return the store and every framework folder under it that holds tables (nothing is created)."""
    return erase.open_folders(uri, options, FRAMEWORK_FOLDERS)


# --------------------------------------------------------------------------- which data belong to a target


def memory_where(target: Target) -> str:
    """Return the SQL selecting a target's memory and ledger rows (its namespaces and below)."""
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


def kv_owned(folder: Folder, target: Target, memory_label: str) -> list[tuple[str, ...]]:
    """Return the folder's LangGraph store namespaces that belong to ``target``."""
    labels = store_labels(memory_label) if folder.main else None
    return [ns for ns in erase.kv_namespaces(folder) if owns_kv(ns, target, labels)]


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
