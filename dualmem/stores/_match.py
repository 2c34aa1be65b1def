"""Filter dicts over JSON values, with the semantics of LangGraph's stores.

Equality on top-level keys (several keys ANDed; a dotted key missing at the
top level is a path, ``"user.name"``), nested dicts match
recursively, lists must be equal element-wise, and ``$eq $ne $gt $gte $lt
$lte`` compare numbers as numbers (a missing key never passes an order
comparison; NaN matches nothing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from langgraph.store.base import ListNamespacesOp, MatchCondition


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _order(op: str) -> Any:
    def compare(actual: Any, wanted: Any) -> bool:
        a, b = _number(actual), _number(wanted)
        if a is None or b is None:
            if isinstance(actual, str) and isinstance(wanted, str):
                a_s, b_s = actual, wanted
                return {"$gt": a_s > b_s, "$gte": a_s >= b_s, "$lt": a_s < b_s, "$lte": a_s <= b_s}[op]
            return False
        return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]

    return compare


def _eq(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, float) and math.isnan(wanted):
        return False
    return bool(actual == wanted)


OPERATORS = {
    "$eq": _eq,
    "$ne": lambda a, b: not _eq(a, b),
    "$gt": _order("$gt"),
    "$gte": _order("$gte"),
    "$lt": _order("$lt"),
    "$lte": _order("$lte"),
}


_ABSENT = object()


def _lookup(value: dict[str, Any], key: str) -> Any:
    """Return ``value[key]``; a dotted key missing at the top level is a path into nested dicts."""
    if key in value or "." not in key:
        return value.get(key)
    node: Any = value
    for part in key.split("."):
        node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is _ABSENT:
            return None
    return node


def matches(value: Any, filt: dict[str, Any]) -> bool:
    """Return True if ``value`` (a dict) satisfies the filter dict."""
    return isinstance(value, dict) and all(_compare(_lookup(value, k), v) for k, v in filt.items())


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            for op, arg in wanted.items():
                if op not in OPERATORS:
                    raise ValueError(f"unsupported filter operator {op!r}; use one of {sorted(OPERATORS)}")
                if not OPERATORS[op](actual, arg):
                    return False
            return True
        return matches(actual, wanted)
    if isinstance(wanted, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    if isinstance(wanted, float) and math.isnan(wanted):
        return False
    return bool(actual == wanted)


def list_namespaces(namespaces: Iterable[tuple[str, ...]], op: ListNamespacesOp) -> list[tuple[str, ...]]:
    """Apply a ``ListNamespacesOp``'s match conditions, depth and paging to namespaces."""
    found = list(set(namespaces))
    for cond in op.match_conditions or ():
        found = [ns for ns in found if _ns_matches(cond, ns)]
    if op.max_depth is not None:
        found = list({ns[: op.max_depth] for ns in found})
    return sorted(found)[op.offset : op.offset + op.limit]


def _ns_matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path) if not isinstance(cond.path, str) else (cond.path,)
    if len(ns) < len(path):
        return False
    if cond.match_type not in ("prefix", "suffix"):
        raise ValueError(f"unsupported namespace match type {cond.match_type!r}; use prefix or suffix")
    pairs = zip(ns, path, strict=False) if cond.match_type == "prefix" else zip(ns[::-1], path[::-1], strict=False)
    return all(p == "*" or k == p for k, p in pairs)
