"""The package installs without the Makefile: a wheel built from this checkout goes into a fresh virtualenv with
``pip install "dualmem[extras]"`` and its console script runs an offline quick start.

Offline, pip cannot download the dependencies, so the fresh virtualenv sees some of the development environment's
installed packages through one ``.pth`` line pointing at a folder of links to them: exactly the distributions
that ``dualmem``'s base requirements pull in, transitively — not DualMem itself, which only the wheel brings, and
no extra. pip resolves the wheel's requirements against them, so the quick start below runs on what
``pip install dualmem`` installs: a module imported without being declared fails it.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


CLEAN = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv sees only its own paths


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _closure(name: str) -> set[str]:
    """Return the installed distributions ``name``'s requirements pull in (markers evaluated, no extras), itself
    included."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _base_deps(into: Path) -> Path:
    """Return a folder of links to the files of the distributions DualMem's base requirements pull in (DualMem's
    own left out)."""
    into.mkdir()
    for key in _closure("dualmem") - {"dualmem"}:
        dist = md.distribution(key)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(str(dist.locate_file(top)))
            if top != ".." and source.exists() and not (into / top).exists() and not top.endswith(".pth"):
                (into / top).symlink_to(source)
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """Return the ``bin`` folder of a fresh virtualenv holding the wheel of this checkout (no extras)."""
    root = tmp_path_factory.mktemp("install")
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        root / "dist",
        REPO,
        cwd=root,
    )
    wheels = list((root / "dist").glob("dualmem-*.whl"))
    assert len(wheels) == 1, wheels
    venv.create(root / "venv", with_pip=False)
    bin_dir = root / "venv" / "bin"
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(f"{_base_deps(root / 'deps')}\n")
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        bin_dir / "python",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        root / "dist",
        "dualmem",
        cwd=root,
        env=CLEAN,
    )
    return bin_dir


def test_the_wheel_holds_the_package_data_and_nothing_of_the_checkout(installed):
    site = next((installed.parent / "lib").glob("python3*/site-packages"))
    package = site / "dualmem"
    assert (package / "data" / "sample_dialogue.json").is_file()
    assert list((package / "data" / "writer_lora").glob("*.xz")), "the shipped writer adapter is in the wheel"
    assert not (site / "tests").exists() and not (site / "benchmarks").exists()
    code = "import dualmem, sys; print(dualmem.__file__)"
    where = _run(installed / "python", "-c", code, cwd=installed.parent, env=CLEAN)
    assert where.strip().startswith(str(site)), f"dualmem imported from {where.strip()}, not from the installed wheel"


def test_the_console_script_runs_an_offline_quick_start(installed, tmp_path):
    env = {
        **os.environ,
        "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "DUALMEM_CHAT_MODEL": "fake:memory",
        "DUALMEM_EMBEDDER": "hash:64",
        "COLUMNS": "300",
    }
    env.pop("PYTHONPATH", None)
    assert "--realmem-sessions" in _run(installed / "dualmem", "demo", "--help", cwd=tmp_path, env=env)
    _run(installed / "dualmem", "sample", "sample.json", cwd=tmp_path, env=env)
    out = _run(installed / "dualmem", "ingest", "sample.json", cwd=tmp_path, env=env)
    assert "mara-okafor" in out
    shown = _run(installed / "dualmem", "inspect", "--persona", "mara-okafor", cwd=tmp_path, env=env)
    assert "fact" in shown.lower() and "insight" in shown.lower()
    answer = _run(
        installed / "dualmem",
        "ask",
        "Should I take the extra shift?",
        "--persona",
        "mara-okafor",
        cwd=tmp_path,
        env=env,
    )
    assert answer.strip()
    listed = _run(installed / "dualmem", "frameworks", cwd=tmp_path, env=env)
    assert "pip install 'dualmem[frameworks]'" in " ".join(listed.split()), (
        "an extra not installed is named, not a traceback"
    )
