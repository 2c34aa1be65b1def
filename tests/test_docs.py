"""The front door: the README stays short, every code block of the README and the docs runs as written, the site builds.

Code blocks run offline, page by page in a fresh folder and in order (a page's later block sees what its earlier
ones wrote), with the environment a newcomer would not set but a test must: the offline fake chat model and hash
embeddings instead of the bundled ones (same code paths, seconds instead of minutes). A marker comment just
before a block changes what is done with it:

- ``<!-- doc-test: compile (why) -->`` — a Python block that needs a key or a server: compiled only (bash: ``bash -n``);
- ``<!-- doc-test: skip (why) -->`` — not run (network installs, long-running servers), shell syntax still checked.

Blocks of other languages (JSON, YAML, text) are checked for syntax where one exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"(?:<!-- doc-test: (?P<mode>run|compile|skip)[^>]*-->\s*\n)?```(?P<lang>[a-z]*)[^\n]*\n(?P<code>.*?)\n```", re.S
)
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "LANGSMITH_TRACING": "false",
    "DUALMEM_CHAT_MODEL": "fake:memory",
    "DUALMEM_EMBEDDER": "hash:64",
    "DUALMEM_FORMATION_IDLE_S": "1",
}


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """Return ``(mode, language, code)`` of every fenced block of a page."""
    return [(m.group("mode") or "run", m.group("lang"), m.group("code")) for m in BLOCK.finditer(page.read_text())]


def test_the_readme_is_a_front_door_of_at_most_15_kb():
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 15_000, f"README.md is {len(text.encode())} bytes"
    assert not re.search(r"\b[0-9a-f]{7,40}\b(?=[ ),.;]|$)", re.sub(r"```.*?```", "", text, flags=re.S)), (
        "no commit hashes in user docs"
    )


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_code_block_of_the_page_runs(page: Path, tmp_path):
    env = {**os.environ, **OFFLINE, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for n, (mode, lang, code) in enumerate(blocks(page), start=1):
        where = f"{page.relative_to(REPO)} block {n}"
        if lang in ("bash", "sh", "shell", "console"):
            checked = subprocess.run(["bash", "-n", "-c", code], capture_output=True, text=True)
            assert checked.returncode == 0, f"{where}: {checked.stderr}"
            if mode == "run":
                done = subprocess.run(
                    ["bash", "-e", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
                )
                assert done.returncode == 0, f"{where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        elif lang == "python":
            compile(code, where, "exec")
            if mode == "run":
                done = subprocess.run(
                    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
                )
                assert done.returncode == 0, f"{where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        elif lang == "json":
            json.loads(code)


def test_the_site_builds_strictly_with_generated_tables(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **OFFLINE},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    config = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "DUALMEM_CHUNK_TOKENS" in config and "DUALMEM_STORE_URI" in config  # the settings table, from the code
    shots = sorted((tmp_path / "site" / "guides" / "img").glob("browser-*.png"))
    assert len(shots) == 3 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in shots), "made by the build"
    bench = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert "Produced by" in bench and "benchmarks/store_bench.py" in bench
