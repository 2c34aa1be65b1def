"""SQL building blocks of the LanceDB stores: literals and namespaces.

No public API takes raw SQL: every SQL filter is built here from quoted literals
and whitelisted column names, so no input can widen a filter (close a
parenthesis, add an ``OR``) or reach another namespace. A search's structured
``filter`` is no SQL at all: :mod:`~dualmem.stores.ranking` reads it over the
rows a namespace scan returned.

Namespaces are stored as one string column: the JSON array of their parts
(``["sophie", "user"]``). JSON is prefix-free and escapes quotes, so the
encoding is collision-free (``("a", "b\\x1fc")`` and ``("a\\x1fb", "c")`` differ),
equality is exact, and a prefix matches at part boundaries with
``ns = '["a"]' OR starts_with(ns, '["a", ')``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from dualmem.errors import ConfigurationError

Namespace = tuple[str, ...]


def sql_str(value: str) -> str:
    """Return ``value`` as a quoted SQL string literal (quotes doubled, NUL refused)."""
    text = str(value)
    if "\x00" in text:
        raise ValueError("a NUL character cannot be stored or searched; remove it from the value")
    return "'" + text.replace("'", "''") + "'"


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
