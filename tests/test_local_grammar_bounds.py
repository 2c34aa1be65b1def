"""Grammar bounds of the bundled model: every structured answer must fit the generation budget."""

from __future__ import annotations

from langchain_core.utils.function_calling import convert_to_json_schema

from dualmem.models.local.grammar import MAX_ITEMS, MAX_STRING, MIN_TEXT, grammar_bounds
from dualmem.models.local.grammar import bound as _bound
from dualmem.schema import MemoryUpdate


def _walk(node, found):
    if isinstance(node, dict):
        if node.get("type") == "string" and "maxLength" in node:
            found["strings"].append(node["maxLength"])
        if node.get("type") == "array":
            found["arrays"].append((node.get("minItems", 0), node["maxItems"]))
        for value in node.values():
            _walk(value, found)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)
    return found


def test_bounds_shrink_with_the_token_budget():
    assert grammar_bounds(4096) == (MAX_STRING, MAX_ITEMS)
    small_string, small_items = grammar_bounds(160)
    assert MIN_TEXT < small_string < MAX_STRING and small_items == 1
    assert grammar_bounds(512)[0] > small_string and grammar_bounds(512)[1] > small_items


def test_bounded_writer_schema_caps_schema_lengths_but_keeps_required_minimums():
    schema = convert_to_json_schema(MemoryUpdate)
    found = _walk(_bound(schema, *grammar_bounds(160)), {"strings": [], "arrays": []})
    limit, items = grammar_bounds(160)
    assert found["strings"] and max(found["strings"]) <= limit  # the schema's own 300/500 are cut down
    assert found["arrays"] and all(lo <= hi for lo, hi in found["arrays"])
    assert all(hi <= max(items, lo) for lo, hi in found["arrays"])
    bounded = _bound(schema, *grammar_bounds(160))
    props = bounded["properties"]
    assert {"facts", "insights"} <= set(bounded["required"])
    assert props["facts"]["minItems"] == 1 and props["insights"]["minItems"] == 1
