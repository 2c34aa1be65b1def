"""Smoke run of the weave generator on the bundled SmolLM2 for one persona with tiny settings.

Marked `integration` (minutes on 2 CPU cores): `make test-integration`. It checks that the
graph runs end to end on a real model and records its rejections, not the quality.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PERSONA = Path(__file__).parent / "fixtures" / "personas" / "mara.json"


def test_weave_runs_end_to_end_on_the_bundled_model(tmp_path):
    from dualmem.config import Settings
    from dualmem.generate import generate_rolememo

    personas = tmp_path / "personas"
    personas.mkdir()
    shutil.copy(PERSONA, personas / PERSONA.name)
    settings = Settings(
        chat_model="local:smollm2",
        embedder="hash:64",
        store_uri=str(tmp_path / "db"),
        checkpoint_path=str(tmp_path / "ck.sqlite"),
        max_new_tokens=256,
        concurrency=1,
    )
    out = generate_rolememo(
        personas, tmp_path / "out", lengths=(2000,), settings=settings, options={"n_per_type": 1, "rounds": 6}
    )
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    checks = manifest.get("checks") or manifest.get("pass_rates") or {}
    assert checks, "the manifest records every check"
    rejections = manifest.get("rejections", [])
    assert all(r.get("reason") for r in rejections), "every rejection carries its reason"
