"""Persona registry beside the memory tables, so `ask`/`chat` can find a persona by id."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from dualmem.errors import ConfigurationError
from dualmem.schema import Persona

TABLE = "personas"
_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("json", pa.string())])


def _table(uri: str):  # noqa: ANN202 - lancedb table
    from dualmem.config import Settings
    from dualmem.stores import _lance as L

    db = L.connect(uri, L.storage_options(Settings().store_options))
    return L.open_or_create(db, TABLE, _SCHEMA)


def save_persona(uri: str, persona: Persona) -> None:
    """Insert or replace ``persona`` in the registry at ``uri`` (the newest row of an id wins)."""
    from dualmem.stores import _lance as L

    row = {"id": persona.id, "json": persona.model_dump_json()}
    table = _table(uri)
    L.retry(lambda: table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute([row]))


def list_personas(uri: str) -> list[Persona]:
    """Return every registered persona (one per id, even if two writers registered it at once)."""
    rows = _table(uri).to_arrow().to_pylist()
    return list({r["id"]: Persona.model_validate_json(r["json"]) for r in rows}.values())


def find_persona(uri: str, ref: str) -> Persona:
    """Return a persona from a JSON file path or a registered id."""
    path = Path(ref)
    if path.suffix == ".json" and path.exists():
        return load_persona_file(path)
    for persona in list_personas(uri):
        if persona.id == ref or persona.name == ref:
            return persona
    known = ", ".join(p.id for p in list_personas(uri)) or "none yet (run `dualmem ingest` first)"
    raise ConfigurationError(f"no persona {ref!r} in {uri}; known: {known}; or pass a persona .json file")


def load_persona_file(path: str | Path) -> Persona:
    """Read a free-form persona JSON file (``name`` required; ``id`` defaults to it)."""
    from dualmem.datasets.personas import read_persona

    return read_persona(path, default_id="name")
