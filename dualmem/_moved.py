"""Modules that moved, importable by their old names for one minor release (each import warns with the new name).

In 0.4.0 chat memory's pending turns and sealing moved from :mod:`dualmem.writer` into :mod:`dualmem.chat`, and
``formation_for`` from ``dualmem.chat.exchange`` into :mod:`dualmem.chat.runtime`. An import of an old name — or of
anything under it — returns the module at its new name (the same object, so patching either patches both) and warns
once per old name with :class:`DeprecationWarning`, naming the release that drops the old name. (The names that
moved in 0.3.0, such as ``dualmem.structured`` or ``dualmem.local``, went in 0.4.0.)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED = {  # old name -> new name; every one goes in GOES_IN
    "dualmem.writer.pending": "dualmem.chat.pending",
    "dualmem.writer.sealing": "dualmem.chat.sealing",
    "dualmem.chat.exchange": "dualmem.chat.runtime",  # formation_for; the hand-over is dualmem.chat.pending's
}
GOES_IN = "0.5.0"


def new_name(old: str) -> str | None:
    """Return where the module ``old`` lives now (None: it did not move)."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before) :]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the one at its new name, already executed."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds a moved module under its old name (see the module docstring)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        moved = new_name(fullname)
        if moved is None:
            return None
        if fullname in MOVED:
            warnings.warn(
                f"{fullname} moved to {moved}; import it from there (the old name goes in {GOES_IN})",
                DeprecationWarning,
                stacklevel=2,
            )
        spec = importlib.util.spec_from_loader(
            fullname, _Alias(moved), is_package=hasattr(sys.modules.get(moved), "__path__")
        )
        return spec


def install() -> None:
    """Let the old names import (once per process)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())  # first: the path finder would load a second copy of a submodule
