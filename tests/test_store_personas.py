"""The persona registry: a batch of personas is one commit, an id keeps one row, the last save of an id wins."""

from __future__ import annotations

from dualmem.schema import Persona
from dualmem.stores import _lance as L
from dualmem.stores.personas import TABLE, find_persona, list_personas, save_persona, save_personas


def _version(uri: str) -> int:
    return L.connect(uri).open_table(TABLE).version


def test_many_personas_are_registered_in_one_commit(tmp_path):
    uri = str(tmp_path / "db")
    save_persona(uri, Persona(id="p-first", name="First", description="the first one"))
    before = _version(uri)
    personas = [Persona(id=f"p{i:03d}", name=f"Persona {i}", description=f"number {i}") for i in range(40)]
    save_personas(uri, personas)
    assert _version(uri) == before + 1
    assert {p.id for p in list_personas(uri)} == {"p-first", *(p.id for p in personas)}


def test_saving_a_persona_again_replaces_it_and_the_last_of_an_id_wins(tmp_path):
    uri = str(tmp_path / "db")
    save_personas(uri, [Persona(id="ana", name="Ana", description="a nurse")])
    save_personas(
        uri,
        [
            Persona(id="ana", name="Ana", description="a night nurse"),
            Persona(id="ana", name="Ana", description="a head nurse"),
        ],
    )
    (ana,) = list_personas(uri)
    assert ana.description == "a head nurse" and find_persona(uri, "Ana") == ana
    assert L.connect(uri).open_table(TABLE).count_rows() == 1
    save_personas(uri, [])  # nothing to save: no commit
    assert _version(uri) == 3
