"""Shared fixtures: offline environment, temporary settings, the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LANGSMITH_TEST_TRACKING", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO / ".." / "shared" / "data"
REALMEM_SOPHIE = SHARED_DATA / "realmem" / "Sophie_Dubois_dialogues_256k.json"
LOCOMO = SHARED_DATA / "locomo" / "locomo10.json"


def need(path: Path) -> Path:
    """Return ``path`` or skip the test, saying which shared file is missing."""
    if not path.exists():
        pytest.skip(f"shared data file {path} is absent (see ../shared/data/README.md)")
    return path


@pytest.fixture
def tmp_settings(tmp_path):
    """Settings writing into a temporary folder, with deterministic hash embeddings."""
    from dualmem.config import Settings

    return Settings(
        store_uri=str(tmp_path / "lancedb"),
        checkpoint_path=str(tmp_path / "checkpoints.sqlite"),
        embedder="hash:64",
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """An S3-compatible object store (moto's server, a dev dependency) on a loopback port; yields its options."""
    import json

    from dualmem.testing.s3 import S3Server

    with S3Server(tmp_path_factory.mktemp("moto")) as server:
        yield {
            "bucket": server.bucket,
            "options": server.options,
            "options_json": json.dumps(server.options),
            "endpoint": server.endpoint,
            "requests": server.requests,  # every request answered so far (method, path, status)
        }
