"""Forget a user, every user of a persona, or one item — every trace of it, and say what went.

``forget(persona, user)`` removes, for the namespace ``(persona, user)``
(:mod:`~dualmem.control.places` says where each part lives, :mod:`~dualmem.stores.erase` which tables hold it):

1. its facts, insights and their version rows, and its ledger rows;
2. the LangGraph store items of the namespace: items beside the memory under
   ``(memory_label, persona, user, …)``, the chat turns waiting for memory
   formation and each chat thread's record (``("dualmem_pending", persona, user, thread)``);
3. every baseline framework's records, values, ledger rows (``{store_uri}/{framework}``);
4. the checkpoints of the user's threads in the SQLite checkpointer (:mod:`~dualmem.control.checkpoints`);
5. the bytes: each table that lost rows is purged (:mod:`~dualmem.stores.purge`): fragments
   rewritten, indexes rebuilt, every older version dropped — **with no grace period**, so a
   reader or writer in the middle of one operation on an older version may fail that operation;
6. the namespace's name on its write-lease slot.

``forget(persona, user, item=ID)`` removes one item: its row, its version rows and
its text in the ledger's plans (the dialogue it came from stays). ``forget(persona)``
(``user=None``) forgets every user of the persona, a batch of users at a time.
The same from a graph: ``await aforget(persona, user, store=runtime.store)`` (the
LangGraph store over the LanceDB store); from the shell: ``dualmem forget``.
The persona's own registration (``personas`` table) is not user data and stays.
A store in RAM (``InMemoryDualStore``) forgets with ``forget_namespace``: nothing is on disk. A store's own
``forget_namespace(namespace)`` / ``forget_item(namespace, item_id)`` forget in that store alone.

Invariants: nothing of another namespace is selected (exact namespace matches,
quoted literals); a forget holds the write lease of every namespace it
deletes from, in the store and in each framework's folder, and refuses
(``wait_s=0``, the default) or waits while a writer holds one — before anything
is deleted; bad input (an unknown persona, user or item) is refused before
any work. A forget that fails part-way can be run again: it deletes what is left.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import dualmem.stores._lance as L
from dualmem.control import places
from dualmem.control.checkpoints import check_checkpoints, checkpoint_file, checkpointed_threads, delete_threads
from dualmem.control.places import Target
from dualmem.errors import ConfigurationError, LeaseTimeout
from dualmem.memory.versions import VERSION_OF
from dualmem.stores import erase
from dualmem.stores._sql import ns_eq_sql, ns_parse, ns_prefix_sql
from dualmem.stores.erase import Folder, Frags

USER_BATCH = 32  # users of a persona forgotten under one set of held leases


@dataclass
class Location:
    """Where a forget acts: the store URI and its options, the memory label, the checkpointer, the lease TTL."""

    uri: str
    options: dict[str, str] | None
    memory_label: str = "dualmem"
    checkpoint_path: str | None = None
    lease_ttl_s: float = 60.0
    checkpoint_note: str = ""  # a configured checkpoint file that does not exist


@dataclass
class ForgetPlan:
    """What a forget will remove (counted before anything is deleted): shown for confirmation, then carried out."""

    target: Target
    where: Location
    folders: list[Folder]
    users: list[str]
    counts: dict[str, int]
    threads: list[str]
    checkpoints: list[str]
    item_rows: list[str] = field(default_factory=list)  # item forget: the pks of the item and its versions

    def lines(self) -> list[str]:
        """Return the plan in words, one line per kind of data."""
        out = [f"forget {self.target.describe()} in {self.where.uri}:"]
        if self.target.user is None:
            out.append(f"  users: {', '.join(self.users) or 'none with memory'}")
        out += [f"  {n} {what}" for what, n in self.counts.items() if n]
        if self.threads:
            out.append(f"  chat threads: {', '.join(self.threads)}")
        if self.checkpoints:
            out.append(f"  checkpointed threads in {self.where.checkpoint_path}: {', '.join(self.checkpoints)}")
        if self.where.checkpoint_note:
            out.append(f"  {self.where.checkpoint_note}")
        return out


@dataclass
class ForgetReport:
    """What a forget removed: rows per ``folder/table``, threads whose checkpoints went, tables purged."""

    target: Target
    users: list[str]
    removed: dict[str, int]
    threads: list[str]
    checkpoints_deleted: int
    purged: dict[str, dict[str, int]]

    def lines(self) -> list[str]:
        """Return the report in words."""
        out = [f"forgot {self.target.describe()}:"]
        out += [f"  {n} row(s) of {where}" for where, n in self.removed.items() if n]
        if self.checkpoints_deleted:
            out.append(f"  checkpoints of {self.checkpoints_deleted} thread(s)")
        if self.threads:
            out.append(f"  chat threads: {', '.join(self.threads)}")
        if self.purged:
            out.append(f"  old versions and index files dropped: {', '.join(sorted(self.purged))}")
        return out


# --------------------------------------------------------------------------- locating


def locate(settings: Any = None, store: Any = None) -> Location:
    """Return where to forget: the given store's URI (a LanceDB ``DualStore`` or LangGraph store), else the settings'."""
    from dualmem.config import Settings, setting_default

    s = Settings.resolve(settings)
    uri, label = s.store_uri, s.memory_label
    options: Any = s.store_options
    if store is not None:
        uri = getattr(store, "uri", None) or ""
        options = getattr(store, "storage_options", None)
        label = getattr(store, "memory_label", label)
        if not uri or uri.startswith("memory://"):
            raise ConfigurationError(
                "forget works on a LanceDB store (a folder or object storage); an in-memory store forgets with "
                "store.drop_namespace(namespace)"
            )
    file, note = checkpoint_file(
        s.checkpoint_path, uri, explicit=s.checkpoint_path != setting_default("checkpoint_path")
    )
    return Location(uri, L.storage_options(options), label, file, s.lease_ttl_s, note)


# --------------------------------------------------------------------------- planning


def _known_users(folder: Folder, persona: str) -> list[str]:
    return sorted(
        {ns[1] for ns in erase.memory_namespaces(folder, ns_prefix_sql((persona,)) or "FALSE") if len(ns) >= 2}
    )


def _nothing(target: Target, main: Folder) -> ConfigurationError:
    users = _known_users(main, target.persona)
    if target.user is not None and users:
        return ConfigurationError(
            f"nothing stored for user {target.user!r} of persona {target.persona!r} in {main.uri}; "
            f"its users: {', '.join(users)} (check --user)"
        )
    personas = sorted({ns[0] for ns in erase.memory_namespaces(main, "TRUE")})
    return ConfigurationError(
        f"nothing stored for persona {target.persona!r} in {main.uri}; personas with memory: "
        f"{', '.join(personas) or 'none'} (check --persona and --store)"
    )


def _item_plan(target: Target, where: Location, main: Folder) -> ForgetPlan:
    assert target.user is not None and target.item is not None
    ns = (target.persona, target.user)
    mine = erase.item_rows(main, ns, target.item)
    if not mine:
        if not erase.memory_rows(main, ns_eq_sql(ns), ["pk"]):
            raise _nothing(target, main)
        raise ConfigurationError(
            f"no item {target.item!r} in {ns} at {where.uri}; `dualmem inspect --persona {ns[0]} "
            f"--user {ns[1]} --all` lists the item ids"
        )
    versions = sum(1 for r in mine if r["id"] != target.item)
    counts = {"item rows": len(mine) - versions, "version rows (history)": versions}
    return ForgetPlan(target, where, [main], [target.user], counts, [], [], [r["pk"] for r in mine])


def _memory_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts = {"facts": 0, "insights": 0, "version rows (history)": 0}
    for r in rows:
        kind = "version rows (history)" if VERSION_OF in json.loads(r["meta"] or "{}") else f"{r['kind']}s"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def plan_forget(target: Target, where: Location, threads: Sequence[str] = ()) -> ForgetPlan:
    """Count what forgetting ``target`` removes; raise a ConfigurationError naming the fix for an unknown target."""
    folders = places.open_folders(where.uri, where.options)
    main = next((f for f in folders if f.main), None)
    if main is None or not main.has_memory:
        raise ConfigurationError(
            f"no DualMem store at {where.uri}; check --store (DUALMEM_STORE_URI) and DUALMEM_STORE_OPTIONS"
        )
    if target.item is not None:
        return _item_plan(target, where, main)
    counts: dict[str, int] = {}
    users: set[str] = set() if target.user is None else {target.user}
    chat_threads: set[str] = set()
    for folder in folders:
        mem = erase.memory_rows(folder, places.memory_where(target), ["namespace", "kind", "meta"])
        users |= {u for r in mem if (u := places.user_of(ns_parse(r["namespace"]), folder, "memory"))}
        owned = places.kv_owned(folder, target, where.memory_label)
        users |= {u for ns in owned if (u := places.user_of(ns, folder, "kv"))}
        ledger = erase.ledger_count(folder, places.memory_where(target))
        kv = erase.kv_count(folder, owned)
        if folder.main:
            chat_threads |= set(places.threads_of(owned))
            counts.update(_memory_counts(mem))
            counts["ledger rows"] = ledger
            counts["LangGraph store items (incl. pending chat turns)"] = kv
        else:
            counts[f"{folder.name} rows"] = len(mem) + ledger + kv
    chat = sorted(chat_threads | set(threads))
    check_checkpoints(where.checkpoint_path, where.checkpoint_note, chat if target.item is None else [])
    ckpt = checkpointed_threads(where.checkpoint_path, target.persona, target.user, chat)
    if not any(counts.values()) and not ckpt:
        raise _nothing(target, main)
    return ForgetPlan(target, where, folders, sorted(users), counts, chat, ckpt)


# --------------------------------------------------------------------------- carrying out


def _hold(stack: ExitStack, plan: ForgetPlan, users: Sequence[str], wait_s: float) -> None:
    """Hold the write lease of every namespace of ``users`` in every folder (refusing or waiting while one is held)."""
    for folder in plan.folders:
        leases = erase.lease_tables(folder, plan.where.lease_ttl_s, wait_s)
        if leases is None:
            continue
        for ns in places.lease_namespaces(folder, users, plan.target.persona):
            try:
                stack.enter_context(leases.hold(ns, owner=None, wait_s=wait_s))
            except LeaseTimeout as exc:
                raise ConfigurationError(
                    f"cannot forget {plan.target.describe()} now: {str(exc).split('. Let')[0]}; nothing was deleted. "
                    "Run forget when that writer is done, or let it wait with --wait SECONDS (wait_s=)"
                ) from None


def _forget_users(
    plan: ForgetPlan, users: Sequence[str], frags: Frags, removed: dict[str, int], threads: set[str]
) -> None:
    """Delete every row of ``users`` (a batch of the persona's users, or the one user) from every folder."""
    targets = [Target(plan.target.persona, u) for u in users]
    memory_sql = " OR ".join(f"({places.memory_where(t)})" for t in targets) or "FALSE"
    for folder in plan.folders:
        owned = [ns for t in targets for ns in places.kv_owned(folder, t, plan.where.memory_label)]
        if folder.main:
            threads.update(places.threads_of(owned))
        for key, gone in erase.delete_rows(folder, memory_sql, owned, frags).items():
            removed[key] = removed.get(key, 0) + gone


def _forget_item(plan: ForgetPlan, frags: Frags, removed: dict[str, int]) -> None:
    assert plan.target.user is not None and plan.target.item is not None
    ns = (plan.target.persona, plan.target.user)
    removed.update(erase.forget_item_rows(plan.folders[0], ns, plan.item_rows, plan.target.item, frags))


def _release_names(plan: ForgetPlan, users: Sequence[str], purged: dict[str, dict[str, int]], unverified: bool) -> None:
    """Clear the forgotten namespaces' names from free lease slots, delete their free lease rows, and purge those
    rows' old versions."""
    for folder in plan.folders:
        names = places.lease_namespaces(folder, users, plan.target.persona)
        purged.update(erase.release_names(folder, names, unverified))


def carry_out(
    plan: ForgetPlan, *, wait_s: float = 0.0, threads: Sequence[str] = (), delete_unverified: bool = False
) -> ForgetReport:
    """Forget what ``plan`` names (see the module docstring); return what was removed."""
    frags: Frags = {}
    removed: dict[str, int] = {}
    found_threads: set[str] = set(plan.threads) | set(threads)
    users = plan.users if plan.target.user is None else [plan.target.user]
    batches = [users[i : i + USER_BATCH] for i in range(0, len(users), USER_BATCH)] or [[]]
    purged: dict[str, dict[str, int]] = {}
    for batch in batches:
        with ExitStack() as stack:
            _hold(stack, plan, batch, wait_s)
            if plan.target.item is not None:
                _forget_item(plan, frags, removed)
            else:
                _forget_users(plan, batch, frags, removed, found_threads)
            purged = _purge_all(plan, frags, delete_unverified) if batch is batches[-1] else {}
    ckpt = (
        []
        if plan.target.item
        else checkpointed_threads(
            plan.where.checkpoint_path, plan.target.persona, plan.target.user, sorted(found_threads)
        )
    )
    deleted = delete_threads(plan.where.checkpoint_path, ckpt)
    if plan.target.item is None:
        _release_names(plan, users, purged, delete_unverified)
    return ForgetReport(plan.target, users, removed, sorted(found_threads | set(ckpt)), deleted, purged)


def _purge_all(plan: ForgetPlan, frags: Frags, unverified: bool) -> dict[str, dict[str, int]]:
    return erase.purge_all(plan.folders, frags, unverified)


# --------------------------------------------------------------------------- the Python API


def forget(
    persona: str,
    user: str | None = None,
    *,
    item: str | None = None,
    settings: Any = None,
    store: Any = None,
    wait_s: float = 0.0,
    threads: Sequence[str] = (),
    delete_unverified: bool = False,
) -> ForgetReport:
    """Forget ``user`` of ``persona`` (``user=None``: every user of it; ``item``: one item of that user).

    ``store``: a LanceDB ``DualStore`` or the LangGraph store over it (``LanceDBStore``, a graph's ``runtime.store``;
    default: the store ``settings`` names); ``wait_s``: how long
    to wait for a writer holding the namespace (0: refuse at once); ``threads``: chat threads to delete from the
    checkpointer besides those found. See the module docstring for what goes and the guarantees.
    """
    if not str(persona or "").strip():
        raise ConfigurationError("forget needs a persona id (--persona)")
    if item is not None and user is None:
        raise ConfigurationError(f"forgetting item {item!r} needs its user (--user)")
    where = locate(settings, store)
    plan = plan_forget(Target(str(persona), None if user is None else str(user), item), where, threads)
    return carry_out(plan, wait_s=wait_s, threads=threads, delete_unverified=delete_unverified)


async def aforget(persona: str, user: str | None = None, **options: Any) -> ForgetReport:
    """Async :func:`forget` (in a worker thread): ``await aforget(persona, user, store=runtime.store)`` in a graph node."""
    return await asyncio.to_thread(forget, persona, user, **options)
