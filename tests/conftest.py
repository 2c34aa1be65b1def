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
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    assert exe, "moto_server is missing: `make test` installs moto[server] (pyproject dev extra)"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"moto_server did not start:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    import boto3

    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).create_bucket(Bucket="dualmem")
    options = {"endpoint": endpoint, "allow_http": "true", "aws_access_key_id": "test",
               "aws_secret_access_key": "test", "region": "us-east-1"}  # fmt: skip
    try:
        yield {"bucket": "dualmem", "options": options, "options_json": json.dumps(options), "endpoint": endpoint}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
