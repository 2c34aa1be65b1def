"""Pack VeRL and what it needs into one archive for a GPU machine without network (``benchmarks/verl_gpu.py run``).

The lent GPU machine has Python 3.12, torch 2.11 (CUDA), numpy, pandas, pyarrow, aiohttp, accelerate, peft and
transformers 5.17, but no Ray, VeRL or Hydra, and takes at most 64 MiB per call. This writes one xz tar of the
packages it lacks, at the versions this machine's ``.venv-verl`` and ``.venv`` hold (the tested combination):

- compiled ones as CPython 3.12 manylinux wheels from the package index (``pip download``), Ray without its Java
  jars, RLlib and dashboard front end;
- pure-Python ones copied from the local venvs (caches, ``tests`` and ``scripts`` folders left out);
- transformers 5.10.4 with tokenizers 0.22.2, since VeRL 0.9.1 wants transformers < 5.11.

On the GPU machine: ``mkdir -p /tmp/site && tar -xJf site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site``::

    python benchmarks/verl_bundle.py --out .whl/site.tar.xz      # about 45 MB, a few minutes (xz on 2 cores)
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITES = [
    REPO / ".venv-verl" / "lib" / "python3.11" / "site-packages",
    REPO / ".venv" / "lib" / "python3.11" / "site-packages",
]
BUILT = [
    "ray",
    "pydantic-core",
    "orjson",
    "rpds-py",
    "uuid-utils",
    "zstandard",
    "watchfiles",
    "tensordict",
    "multiprocess",
    "tokenizers",
]
PURE = [
    "verl",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "codetiming",
    "torchdata",
    "datasets",
    "dill",
    "cachetools",
    "colorful",
    "fastapi",
    "starlette",
    "uvicorn",
    "sniffio",
    "pydantic",
    "annotated-types",
    "typing-inspection",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rfc3339-validator",
    "pyvers",
    "langchain-core",
    "langchain-protocol",
    "langsmith",
    "jsonpatch",
    "jsonpointer",
    "requests-toolbelt",
    "distro",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-semantic-conventions",
    "importlib-metadata",
    "transformers",
]
RAY_EXTRAS = ["ray/jars", "ray/rllib", "ray/dashboard/client/build"]
PLATFORMS = [
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def local_dists() -> dict[str, md.Distribution]:
    """Return the distributions of the local venvs by normalised name (``.venv-verl`` first, as VeRL runs see them)."""
    found: dict[str, md.Distribution] = {}
    for site in SITES:
        for dist in md.distributions(path=[str(site)]):
            found.setdefault(_norm(dist.metadata["Name"]), dist)
    return found


def _unzip(wheel: Path, dest: Path) -> None:
    """Extract a wheel keeping its files' permission bits (Ray's servers are executables)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, dest))
            mode = info.external_attr >> 16
            if mode and not info.is_dir():
                os.chmod(path, mode & 0o777)


def _copy_dist(dist: md.Distribution, site: Path, dest: Path) -> None:
    tops = {f.parts[0] for f in (dist.files or []) if f.parts[0] not in ("..", "__pycache__", "tests", "scripts")}
    for top in tops:
        src = site / top
        if src.is_dir():
            shutil.copytree(src, dest / top, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dest / top)


def build(out: Path, python: str = "3.12") -> Path:
    dists = local_dists()
    missing = [n for n in BUILT + PURE if _norm(n) not in dists]
    if missing:
        raise SystemExit(f"not installed here: {', '.join(missing)} (make verl-venv; pip install -e '.[train]')")
    with tempfile.TemporaryDirectory(prefix="verl-bundle-") as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        site.mkdir()
        for name in BUILT:
            spec = f"{name}=={dists[_norm(name)].version}"
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--implementation",
                "cp",
                *[a for p in PLATFORMS for a in ("--platform", p)],
                "-d",
                str(wheels),
                spec,
            ]
            if subprocess.run(cmd).returncode != 0:
                raise SystemExit(f"pip download {spec} failed (needs the package index)")
        for wheel in sorted(wheels.glob("*.whl")):
            _unzip(wheel, site)
        for extra in RAY_EXTRAS:
            shutil.rmtree(site / extra, ignore_errors=True)
        for name in PURE:
            dist = dists[_norm(name)]
            _copy_dist(dist, Path(str(dist.locate_file(""))), site)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:xz", preset=6) as tar:
            for child in sorted(site.iterdir()):
                tar.add(child, arcname=child.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".whl/site.tar.xz")
    ap.add_argument(
        "--python", default="3.12", help="the GPU machine's Python (wheels of compiled packages are fetched for it)"
    )
    args = ap.parse_args()
    path = build(Path(args.out), args.python)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
