"""Dataset loaders and writers: RoleMemo, RealMem, LoCoMo, and the bundled sample.

>>> item = load_sample()
>>> len(item.queries)
3
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from dualmem.datasets._validate import read_json
from dualmem.datasets.locomo import load_locomo, normalise_evidence
from dualmem.datasets.realmem import dump_realmem, load_realmem, parse_realmem
from dualmem.datasets.rolememo import FORMAT as ROLEMEMO_FORMAT
from dualmem.datasets.rolememo import dump_rolememo, load_rolememo, parse_rolememo
from dualmem.errors import ConfigurationError, DatasetError
from dualmem.schema import Dataset, DatasetItem, Persona

DatasetKind = Literal["auto", "rolememo", "realmem", "locomo"]
KINDS: tuple[str, ...] = ("rolememo", "realmem", "locomo")


def detect_kind(path: str | Path) -> str:
    """Return the format of a dataset file or folder: ``rolememo``, ``realmem`` or ``locomo``.

    A folder is a RoleMemo dataset (one file per history); a file is recognised by its top-level
    shape (RoleMemo's ``format`` key, RealMem's ``dialogues`` and ``_metadata``, LoCoMo's list of
    conversations with ``qa``). Anything else is a one-line error naming the formats.
    """
    target = Path(path)
    if target.is_dir():
        return "rolememo"
    data = read_json(target)
    if isinstance(data, dict) and data.get("format") == ROLEMEMO_FORMAT:
        return "rolememo"
    if isinstance(data, dict) and "dialogues" in data:
        return "realmem"
    first = data[0] if isinstance(data, list) and data else None
    if isinstance(first, dict) and "conversation" in first and "qa" in first:
        return "locomo"
    if isinstance(data, dict) and ("dialogue" in data or "queries" in data):
        return "rolememo"  # a RoleMemo file missing its format key: its loader names what is wrong
    found = type(data).__name__ if not isinstance(data, dict) else f"an object with keys {sorted(data)[:6]}"
    raise DatasetError(
        str(target),
        "$",
        f"a RoleMemo (format {ROLEMEMO_FORMAT!r}), RealMem (dialogues) or LoCoMo (conversation, qa) file",
        found,
    )


def load_dataset(kind: DatasetKind | str, path: str | Path, *, limit_sessions: int | None = None) -> Dataset:
    """Load a dataset of ``kind`` (``auto``: detected from the file; rolememo, realmem, locomo) from a file or folder."""
    if kind == "auto":
        kind = detect_kind(path)
    if kind == "rolememo":
        return load_rolememo(path, limit_sessions=limit_sessions)
    if kind == "realmem":
        return load_realmem(path, limit_sessions=limit_sessions)
    if kind == "locomo":
        return load_locomo(path, limit_sessions=limit_sessions)
    raise ConfigurationError(f"unknown dataset kind {kind!r}; use auto or one of {', '.join(KINDS)}")


def sample_path(name: str = "sample_dialogue.json") -> Path:
    """Return the path of a bundled sample file (``sample_dialogue.json`` or ``sample_persona.json``)."""
    return Path(str(resources.files("dualmem") / "data" / name))


def load_sample_persona() -> Persona:
    """Return the bundled sample persona."""
    path = sample_path("sample_persona.json")
    data = read_json(path)
    try:
        return Persona.model_validate(data)
    except Exception as exc:  # noqa: BLE001 - reported as a dataset error
        raise DatasetError(str(path), "$", "a Persona object", str(exc).splitlines()[0]) from None


def load_sample() -> DatasetItem:
    """Return the bundled RoleMemo sample: one persona, four dated sessions, three queries."""
    return parse_rolememo(read_json(sample_path()), sample_path())


__all__ = [
    "KINDS",
    "ROLEMEMO_FORMAT",
    "DatasetError",
    "dump_realmem",
    "detect_kind",
    "dump_rolememo",
    "load_dataset",
    "load_locomo",
    "load_realmem",
    "load_rolememo",
    "load_sample",
    "load_sample_persona",
    "normalise_evidence",
    "parse_realmem",
    "parse_rolememo",
    "sample_path",
]
