"""A real S3-compatible server for tests and benchmarks: moto's, on a loopback port, with its request log.

One place starts it for the test suite (``tests/conftest.py``) and the object-store benchmarks (``growth.py``,
``rolememo_dry_run.py``). Invariants: the server listens on 127.0.0.1 only, on a port free when it started; the bucket
exists before :class:`S3Server` returns; every request the server answered is one line of its log, which
:meth:`S3Server.requests` parses; :meth:`S3Server.close` stops the process (also on leaving a ``with`` block).
Needs ``moto[server]`` (the dev extra) and ``boto3``, imported only here.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REQUEST = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
"""One answered request in moto's log (werkzeug's access line)."""


class S3Server:
    """moto's S3 server on a loopback port with one bucket; ``uri`` is a store URI in it, ``options`` its LanceDB
    storage options."""

    def __init__(self, folder: Path, bucket: str = "dualmem", start_s: float = 60.0) -> None:
        exe = shutil.which("moto_server", path=str(Path(sys.executable).parent))
        if not exe:
            raise RuntimeError("moto_server is missing: pip install 'moto[server]' (the dev extra)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.log = Path(folder) / "s3.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [exe, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
            )
        self.endpoint = f"http://127.0.0.1:{port}"
        deadline = time.time() + start_s
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.close()
                    raise RuntimeError(f"moto_server did not start:\n{self.log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        import boto3

        self.bucket = bucket
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )
        self.client.create_bucket(Bucket=bucket)
        self.uri = f"s3://{bucket}/db"
        self.options = {
            "endpoint": self.endpoint,
            "allow_http": "true",
            "aws_access_key_id": "test",
            "aws_secret_access_key": "test",
            "region": "us-east-1",
        }

    def requests(self) -> list[dict[str, str]]:
        """Every request the server has answered so far: ``method``, ``path``, ``status``."""
        return [m.groupdict() for m in REQUEST.finditer(self.log.read_text(errors="replace"))]

    def size(self) -> tuple[int, int]:
        """Return (objects, bytes) in the bucket."""
        count = total = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for obj in page.get("Contents", []):
                count, total = count + 1, total + obj["Size"]
        return count, total

    def close(self) -> None:
        """Stop the server (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
