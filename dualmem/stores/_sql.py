"""SQL building blocks of the LanceDB stores: literals, namespaces, structured filters.

No public API takes raw SQL: every filter is built here from quoted literals
and whitelisted column names, so no input can widen a filter (close a
parenthesis, add an ``OR``) or reach another namespace.

Namespaces are stored as one string column: the JSON array of their parts
(``["sophie", "user"]``). JSON is prefix-free and escapes quotes, so the
encoding is collision-free (``("a", "b\\x1fc")`` and ``("a\\x1fb", "c")`` differ),
equality is exact, and a prefix matches at part boundaries with
``ns = '["a"]' OR starts_with(ns, '["a", ')``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dualmem.errors import ConfigurationError

Namespace = tuple[str, ...]


def sql_str(value: str) -> str:
    """Return ``value`` as a quoted SQL string literal (quotes doubled, NUL refused)."""
    text = str(value)
    if "\x00" in text:
        raise ValueError("a NUL character cannot be stored or searched; remove it from the value")
    return "'" + text.replace("'", "''") + "'"


def sql_literal(value: Any) -> str:
    """Return a SQL literal for a string, bool, int or finite float."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"filter value {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        return sql_str(value)
    raise ValueError(f"filter value {value!r} must be a string, number or boolean")


def sql_in(column: str, values: Iterable[str]) -> str:
    """Return ``column IN (...)`` for string values (``FALSE`` when empty)."""
    vals = [sql_str(v) for v in values]
    return f"{column} IN ({', '.join(vals)})" if vals else "FALSE"


def and_all(*clauses: str | None) -> str | None:
    """Join non-empty SQL clauses with AND (each in parentheses)."""
    parts = [f"({c})" for c in clauses if c]
    return " AND ".join(parts) if parts else None


# --------------------------------------------------------------------------- namespaces


def ns_key(namespace: Sequence[str]) -> str:
    """Encode a namespace tuple as its stored string key."""
    if isinstance(namespace, str):
        raise ConfigurationError(
            f"a namespace is a tuple of strings, got the string {namespace!r}; pass ({namespace!r},)"
        )
    parts = list(namespace)
    for part in parts:
        if not isinstance(part, str):
            raise ConfigurationError(
                f"namespace {tuple(parts)!r}: every part must be a string, got {type(part).__name__}"
            )
    return json.dumps(parts, ensure_ascii=False)


def ns_parse(key: str) -> Namespace:
    """Decode a stored namespace key."""
    return tuple(json.loads(key))


def ns_prefix_sql(prefix: Sequence[str], column: str = "namespace") -> str | None:
    """Return a SQL filter matching ``prefix`` and every namespace below it (None for the root)."""
    if not prefix:
        return None
    key = ns_key(prefix)
    return f"{column} = {sql_str(key)} OR starts_with({column}, {sql_str(key[:-1] + ', ')})"


def ns_eq_sql(namespace: Sequence[str], column: str = "namespace") -> str:
    """Return a SQL filter matching exactly ``namespace``."""
    return f"{column} = {sql_str(ns_key(namespace))}"


def row_key(namespace: Sequence[str], item_id: str) -> str:
    """Return the stored primary key of an item: its namespace key followed by its id.

    The namespace key is a JSON array, which is prefix-free, so two different
    (namespace, id) pairs never share a key: an id is unique per namespace only.
    """
    return ns_key(namespace) + str(item_id)


# --------------------------------------------------------------------------- structured filters

_OPS = {"$eq": "=", "$ne": "!=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def filter_sql(filt: Mapping[str, Any] | None, columns: Mapping[str, str]) -> str | None:
    """Compile a filter dict over whitelisted columns into SQL.

    ``{"session_id": "s1", "event_time": {"$gte": "2024-01-01"}, "chunk_id": {"$in": ["c1", "c2"]}}``:
    plain values mean equality, operator dicts use ``$eq $ne $gt $gte $lt $lte $in``;
    several keys are ANDed. ``columns`` maps the public key to its column name.
    """
    if not filt:
        return None
    clauses = []
    for key, wanted in filt.items():
        column = columns.get(key)
        if column is None:
            raise ConfigurationError(f"cannot filter on {key!r}; filterable fields are {sorted(columns)}")
        conditions = wanted if isinstance(wanted, Mapping) else {"$eq": wanted}
        for op, arg in conditions.items():
            if op == "$in":
                if not isinstance(arg, list | tuple | set):
                    raise ConfigurationError(f"filter {key!r}: $in takes a list, got {type(arg).__name__}")
                clauses.append(f"{column} IN ({', '.join(sql_literal(v) for v in arg)})" if arg else "FALSE")
            elif op in _OPS:
                if arg is None:
                    clauses.append(f"{column} IS {'NOT ' if op == '$ne' else ''}NULL")
                else:
                    clauses.append(f"{column} {_OPS[op]} {sql_literal(arg)}")
            else:
                raise ConfigurationError(f"filter {key!r}: unknown operator {op!r}; use one of {[*_OPS, '$in']}")
    return and_all(*clauses)


def row_matches(row: Mapping[str, Any], filt: Mapping[str, Any] | None, columns: Mapping[str, str]) -> bool:
    """Return True if ``row`` passes the filter dict, with :func:`filter_sql`'s semantics (a NULL passes nothing).

    The same filter compiled by :func:`filter_sql` and run by LanceDB keeps the same rows, so
    a backend or a RAM snapshot without SQL filters exactly as the LanceDB backend does.
    """
    if not filt:
        return True
    filter_sql(filt, columns)  # validates keys, operators and values with the same errors
    for key, wanted in filt.items():
        actual = row.get(columns[key])
        conditions = wanted if isinstance(wanted, Mapping) else {"$eq": wanted}
        for op, arg in conditions.items():
            if op == "$in":
                if actual is None or actual not in list(arg):
                    return False
            elif arg is None:
                if (actual is None) != (op != "$ne"):
                    return False
            elif actual is None or not _compare(actual, op, arg):
                return False
    return True


def _compare(actual: Any, op: str, arg: Any) -> bool:
    if isinstance(actual, str) != isinstance(arg, str):
        return False
    return {
        "$eq": actual == arg, "$ne": actual != arg, "$gt": actual > arg,
        "$gte": actual >= arg, "$lt": actual < arg, "$lte": actual <= arg,
    }[op]  # fmt: skip


def in_window(event_time: str | None, since: str | None, until: str | None) -> bool:
    """Return True if an item's ``event_time`` lies in [since, until] (ISO text; a NULL time passes no bound)."""
    if not (since or until):
        return True
    if not event_time:
        return False
    return (not since or event_time >= since) and (not until or event_time <= until)
