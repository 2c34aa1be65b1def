"""The public API changes only with notice: griffe's breaking-change check of the code against the last release's
snapshot (tests/fixtures/api/, written by snapshot.py when a release is tagged); every break must be named in
CHANGELOG.md, and every public module declares ``__all__``."""

from __future__ import annotations

import importlib
import json
import lzma
import re
from pathlib import Path

from conftest import REPO

SNAPSHOTS = REPO / "tests" / "fixtures" / "api"
# the public API: these modules' __all__ (and the members of what they list); the reference docs document them
PUBLIC = (
    "dualmem",
    "dualmem.auth",
    "dualmem.config",
    "dualmem.context",
    "dualmem.schema",
    "dualmem.errors",
    "dualmem.stores",
    "dualmem.retrieval",
    "dualmem.writer",
    "dualmem.chat",
    "dualmem.control",
    "dualmem.datasets",
    "dualmem.frameworks",
    "dualmem.graphs.respond",
    "dualmem.graphs.write",
    "dualmem.models",
    "dualmem.testing",
)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def last_release() -> tuple[str, object]:
    import griffe

    from dualmem import __version__

    found = sorted(
        (p for p in SNAPSHOTS.glob("dualmem-*.json.xz") if _version(p.name) < _version(__version__)),
        key=lambda p: _version(p.name),
    )
    assert found, f"no API snapshot of a release before {__version__} in {SNAPSHOTS}"
    path = found[-1]
    decoded = json.loads(lzma.decompress(path.read_bytes()), object_hook=griffe.json_decoder)
    collection = griffe.ModulesCollection()  # griffe resolves aliases through the package's modules collection
    package = griffe.Module(decoded.name, modules_collection=collection)
    for name, member in decoded.members.items():
        package.set_member(name, member)
    package.exports = decoded.exports
    collection.set_member(package.path, package)
    return path.name, package


def public_paths() -> set[str]:
    out = set()
    for name in PUBLIC:
        module = importlib.import_module(name)
        out |= {f"{name}.{member}" for member in module.__all__}
        for member in module.__all__:  # an alias: its home too
            home = getattr(getattr(module, member, None), "__module__", None)
            if home:
                out.add(f"{home}.{member}")
    return out


def test_every_public_module_declares_all():
    missing = [name for name in PUBLIC if not isinstance(getattr(importlib.import_module(name), "__all__", None), list)]
    assert not missing, f"public modules without __all__: {missing}"


def test_no_break_of_the_public_api_without_a_changelog_entry():
    import griffe

    release, old = last_release()
    new = griffe.load("dualmem", search_paths=[REPO])
    public = public_paths()
    changelog = (REPO / "CHANGELOG.md").read_text()
    unannounced = []
    for brk in griffe.find_breaking_changes(old, new):
        path = brk.obj.path
        if not any(path == p or path.startswith(p + ".") for p in public):
            continue  # not public API
        names = {part for part in path.split(".") if not part.startswith("__")}
        names.add(getattr(brk.old_value, "name", "") or "")
        if not any(n and f"`{n}" in changelog or f".{n}`" in changelog for n in names):
            unannounced.append(f"{path}: {brk.kind.value}")
    assert not unannounced, f"breaks of the public API since {release} without a CHANGELOG.md entry: {unannounced}"


def test_the_check_catches_a_removed_public_name(tmp_path):
    """The check can fail: a release that had ``users_of`` and code without it is a break."""
    import griffe

    _, old = last_release()
    new = griffe.load("dualmem", search_paths=[REPO])
    del new["stores"].members["users_of"]
    kinds = {(b.obj.path, b.kind.value) for b in griffe.find_breaking_changes(old, new)}
    assert ("dualmem.stores.users_of", "Public object was removed") in kinds
    assert Path(tmp_path).is_dir()


def test_moved_module_names_last_one_minor_release():
    """Shims last one minor release: the names moved in 0.3.0 went in 0.4.0, those moved in 0.4.0 in 0.5.0; their
    new names import."""
    import importlib

    import pytest

    gone = ("dualmem.structured", "dualmem.local", "dualmem.scripted")  # moved in 0.3.0
    gone += ("dualmem.writer.pending", "dualmem.writer.sealing", "dualmem.chat.exchange")  # moved in 0.4.0
    for old in gone:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    for new in ("dualmem.chat.pending", "dualmem.chat.sealing", "dualmem.chat.runtime", "dualmem.models.structured"):
        importlib.import_module(new)
