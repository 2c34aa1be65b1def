"""The dual memory seen through the LangGraph store API (and so through the server's ``/store``).

Namespaces ``(label, persona, user, "fact" | "insight")`` — ``label`` is the
``memory_label`` setting, ``"dualmem"`` by default — map onto the ``DualStore``
tables at the same URI: an item's key is the memory id and its value the
memory item as JSON (``text``, also under ``content`` as LangMem's tools write
it, ``source``, ``grounding``, ``status``…). Other namespaces under the label
(say ``("dualmem", "settings")``) are ordinary store items.

Get, put (upsert; ``text`` or ``content`` required; insights need
``grounding``), delete, and search work (a put over an item or a delete keeps the replaced state as
a version row: :mod:`~dualmem.stores.revisions`); a search prefix shorter than four
labels (``("dualmem", persona)``) covers every memory namespace below it, as
LangGraph's prefix semantics say. A query search ranks by cosine similarity
(the score LangGraph's stores report), so memory and ordinary items rank on
one scale. Facts and insights do not expire: they are superseded instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from langgraph.store.base import GetOp, Item, PutOp, SearchItem, SearchOp

from dualmem.errors import ConfigurationError
from dualmem.schema import Fact, Insight, MemoryItem
from dualmem.stores._match import matches
from dualmem.stores.revisions import remove, revise

KINDS = ("fact", "insight")


def memory_namespace(persona: str, user: str, kind: str, label: str = "dualmem") -> tuple[str, str, str, str]:
    """Return the LangGraph store namespace of a (persona, user) memory's facts or insights.

    >>> memory_namespace("mara-okafor", "theo", "fact")
    ('dualmem', 'mara-okafor', 'theo', 'fact')
    """
    if kind not in KINDS:
        raise ConfigurationError(f"memory kind {kind!r} is not one of fact, insight")
    return (label, str(persona), str(user), kind)


class MemoryView:
    """Facts and insights of a ``DualStore`` as LangGraph store items under ``(label, persona, user, kind)``."""

    def __init__(self, dual: Any, label: str) -> None:
        self.check_label(label)
        self.dual, self.label = dual, label

    # ------------------------------------------------------------------ shapes

    @staticmethod
    def check_label(label: str) -> None:
        """Raise unless ``label`` can head memory namespaces."""
        if not label or "." in label:
            raise ConfigurationError(f"memory_label {label!r} must be a non-empty label without '.'")

    @staticmethod
    def owns_namespace(namespace: Sequence[str], label: str) -> bool:
        """Return True for a memory item namespace ``(label, persona, user, kind)``."""
        ns = tuple(namespace)
        return len(ns) == 4 and ns[0] == label and ns[3] in KINDS

    @staticmethod
    def covers_prefix(prefix: Sequence[str], label: str) -> bool:
        """Return True if a search under ``prefix`` may reach memory items."""
        ns = tuple(prefix)
        return not ns or (ns[0] == label and (len(ns) < 4 or MemoryView.owns_namespace(ns, label)))

    def _targets(self, prefix: Sequence[str]) -> list[tuple[tuple[str, ...], str]]:
        """Return the (memory namespace, kind) pairs below a search prefix."""
        rest = tuple(prefix)[1:]
        kinds = [rest[2]] if len(rest) == 3 else list(KINDS)
        return [(ns, kind) for kind in kinds for ns in self.dual.namespaces(rest[:2], kind=kind) if len(ns) == 2]

    def _item(self, item: MemoryItem, score: float | None | bool = False) -> Item:
        value = item.model_dump(mode="json", exclude={"namespace"})
        value["content"] = item.text
        kwargs: dict[str, Any] = {
            "namespace": (self.label, *item.namespace, item.kind),
            "key": item.id,
            "value": value,
            "created_at": item.created_at,
            "updated_at": item.updated_at,
        }
        return Item(**kwargs) if score is False else SearchItem(**kwargs, score=score)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ operations

    def get(self, op: GetOp) -> Item | None:
        """Return the memory item ``op.key`` of exactly ``op.namespace``."""
        _, persona, user, kind = op.namespace
        found = [i for i in self.dual.get((persona, user), [op.key]) if i.kind == kind]
        return self._item(found[0]) if found else None

    def search(self, op: SearchOp, qvec: Sequence[float] | None) -> list[SearchItem]:
        """Return the memory items below ``op.namespace_prefix`` (ranked when ``qvec``), before paging."""
        status = None if op.filter and "status" in op.filter else "active"
        hits: list[tuple[MemoryItem, float | None]] = []
        want = op.offset + op.limit
        for ns, kind in self._targets(op.namespace_prefix):
            if qvec is None:
                hits.extend((i, None) for i in self.dual.list(ns, kind=kind, status=status) if self._keeps(i, op))
                continue
            fetch = want if not op.filter else max(4 * want, 200)
            while (
                True
            ):  # a filter may drop most of the nearest items: fetch more until the page is full or none are left
                found = self.dual.search(
                    ns, op.query or "", kind=kind, k=fetch, mode="vector", status=status, vector=qvec
                )
                kept = [(h.item, float(h.score)) for h in found if self._keeps(h.item, op)]
                if len(kept) >= want or len(found) < fetch:
                    break
                fetch *= 4
            hits.extend(kept)
        return [self._item(i, s) for i, s in hits]  # type: ignore[misc]

    def _keeps(self, item: MemoryItem, op: SearchOp) -> bool:
        return not op.filter or matches(self._item(item).value, op.filter)

    def put(self, op: PutOp) -> None:
        """Upsert or (value None) delete a memory item of exactly ``op.namespace``."""
        _, persona, user, kind = op.namespace
        ns = (persona, user)
        if op.value is None:
            remove(self.dual, ns, op.key)  # the deleted state stays as a version row (history)
            return
        value = {k: v for k, v in dict(op.value).items() if k not in {"id", "namespace", "kind"}}
        text = value.pop("content", None)
        if "text" not in value and text is not None:
            value["text"] = text
        if not str(value.get("text") or "").strip():
            raise ConfigurationError(f"a memory item needs `text` (or `content`); got keys {sorted(op.value)}")
        if op.ttl is not None:
            _warn_ttl_once()
        old = self.dual.get(ns, [op.key])
        if old:
            merged = old[0].model_dump(mode="json", exclude={"namespace", "id", "kind"})
            value = {**merged, **value, "created_at": old[0].created_at}
        cls = Fact if kind == "fact" else Insight
        try:
            item = cls(id=op.key, namespace=ns, **value)
        except ValueError as exc:
            raise ConfigurationError(f"memory item {op.key!r} in {tuple(op.namespace)}: {exc}") from exc
        if isinstance(item, Insight):
            missing = set(item.grounding) - {f.id for f in self.dual.get(ns, item.grounding)}
            if missing:
                raise ConfigurationError(
                    f"insight {op.key!r} cites {sorted(missing)}, which are not facts of {tuple(op.namespace[:3])}"
                )
        revise(self.dual, item)  # a replaced state stays as a version row (history)

    def namespaces(self) -> list[tuple[str, ...]]:
        """Return the store namespaces of every memory namespace that holds items."""
        return [(self.label, *ns, kind) for kind in KINDS for ns in self.dual.namespaces(kind=kind) if len(ns) == 2]


_WARNED: set[str] = set()


def _warn_ttl_once() -> None:
    """Warn once per process that a TTL reached a memory item: facts and insights do not expire."""
    if "ttl" in _WARNED:
        return
    _WARNED.add("ttl")
    warnings.warn(
        "TTL does not apply to DualMem facts and insights: they are kept until the writer supersedes or deletes "
        "them (the store's key-value items do expire); the ttl of this put is ignored",
        UserWarning,
        stacklevel=5,
    )
