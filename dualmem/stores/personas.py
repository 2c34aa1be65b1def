"""Persona registry beside the memory tables, so `ask`/`chat` can find a persona by id."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from dualmem.errors import ConfigurationError
from dualmem.schema import Persona

TABLE = "personas"
_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("json", pa.string())])


def _open_personas(uri: str, options: str | dict[str, str] | None):
    from dualmem.stores import _lance as L

    return L.open_or_create(L.connect(uri, L.storage_options(options)), TABLE, _SCHEMA)


def save_persona(uri: str, persona: Persona, options: str | dict[str, str] | None = None) -> None:
    """Insert or replace ``persona`` in the registry at ``uri`` (``options``: the store's storage options)."""
    save_personas(uri, [persona], options)


def save_personas(uri: str, personas: Iterable[Persona], options: str | dict[str, str] | None = None) -> None:
    """Insert or replace every persona in the registry at ``uri`` in one commit (the last one of an id wins)."""
    from dualmem.stores import _lance as L

    rows = list({p.id: {"id": p.id, "json": p.model_dump_json()} for p in personas}.values())
    if not rows:
        return
    table = _open_personas(uri, options)
    L.retry(lambda: table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows))


def list_personas(uri: str, options: str | dict[str, str] | None = None) -> list[Persona]:
    """Return every registered persona (one per id, even if two writers registered it at once)."""
    rows = _open_personas(uri, options).to_arrow().to_pylist()
    return list({r["id"]: Persona.model_validate_json(r["json"]) for r in rows}.values())


def find_persona(uri: str, ref: str, options: str | dict[str, str] | None = None) -> Persona:
    """Return a persona from a JSON file path or a registered id or name."""
    path = Path(ref)
    if path.suffix == ".json" and path.exists():
        return load_persona_file(path)
    known = list_personas(uri, options)
    for persona in known:
        if persona.id == ref or persona.name == ref:
            return persona
    names = ", ".join(p.id for p in known) or "none yet (run `dualmem ingest` first)"
    raise ConfigurationError(f"no persona {ref!r} in {uri}; known: {names}; or pass a persona .json file")


def load_persona_file(path: str | Path) -> Persona:
    """Read a free-form persona JSON file (``name`` required; ``id`` defaults to it)."""
    from dualmem.datasets.personas import read_persona

    return read_persona(path, default_id="name")
