"""Free-form persona files: one reader for ``dualmem generate``, ``ask -p`` and ``chat -p``.

Keys are normalised ("core values", "role", "personality" …), list fields given
as one string are split on ``;``, new lines and bullets (never on commas: "check
twice, sail once" is one value), and every failure is a one-line
:class:`~dualmem.errors.DatasetError` (file, JSON path, expected, found) —
invalid JSON, bytes that are not UTF-8 and JSON nested too deep included.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from dualmem.datasets._validate import error_from_validation, read_json
from dualmem.errors import DatasetError
from dualmem.schema import Persona

ALIASES = {
    "role": "description",
    "occupation": "description",
    "values": "core_values",
    "core_value": "core_values",
    "personality": "traits",
    "personality_traits": "traits",
    "skills": "expertise",
    "user": "user_profile",
    "user_persona": "user_profile",
    "persona_id": "id",
}
LIST_FIELDS = ("core_values", "traits", "expertise", "goals")


def read_persona(path: str | Path, *, default_id: Literal["stem", "name"] = "stem") -> Persona:
    """Read a persona JSON file; ``default_id``: an id-less persona takes its file's stem or its name."""
    path = Path(path)
    data = read_json(path)
    if isinstance(data, dict) and isinstance(data.get("persona"), dict):
        data = {**data["persona"], **({"user_profile": data["user_profile"]} if "user_profile" in data else {})}
    if not isinstance(data, dict):
        raise DatasetError(str(path), "$", "a JSON object with a persona", type(data).__name__)
    norm: dict[str, Any] = {}
    for key, value in data.items():
        k = re.sub(r"[\s-]+", "_", str(key).strip().lower())
        if not (k == "personality" and isinstance(value, dict)):  # a dict is Persona.personality's own labels
            k = ALIASES.get(k, k)
        if k == "description" and "description" in norm:
            k = "role_description"
        norm[k] = value
    for k in LIST_FIELDS:
        if isinstance(norm.get(k), str):
            norm[k] = [v.strip(" \t-*•") for v in re.split(r"[;\n]", norm[k]) if v.strip(" \t-*•")]
    if not isinstance(norm.get("name"), str) or not norm["name"].strip():
        raise DatasetError(str(path), "$.name", "a non-empty string", repr(norm.get("name")))
    if default_id == "stem":
        norm.setdefault("id", re.sub(r"[^A-Za-z0-9]+", "-", path.stem).strip("-").lower() or norm["name"])
    else:
        norm.setdefault("id", norm["name"].replace(" ", "_"))
    try:
        return Persona.model_validate(norm)
    except ValidationError as exc:
        raise error_from_validation(path, exc) from None
