"""Put on ``PYTHONPATH`` of a VeRL run (``dualmem train rl --engine verl --launch`` does): hides an incompatible TRL.

VeRL 0.9.1 monkey-patches TRL's ``AutoModelForCausalLMWithValueHead`` whenever ``trl`` is importable; TRL 0.20+
(the one DualMem's own GRPO uses, visible from ``.venv-verl`` through ``_main_venv.pth``) no longer has that class,
so every VeRL worker fails while building its model. GRPO needs no value head: when the class is missing, ``trl``
is marked absent in this process (``sys.modules["trl"] = None``, so VeRL's ``is_trl_available()`` is False).
Python imports this module at start-up in every process that has its folder on ``PYTHONPATH`` (Ray workers too).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def has_value_head(package: Path) -> bool:
    """Return True when the TRL package in ``package`` has VeRL's value-head class (read from its files, not imported)."""
    init = package / "__init__.py"
    top = init.exists() and "AutoModelForCausalLMWithValueHead" in init.read_text(encoding="utf-8", errors="replace")
    return top or (package / "experimental" / "ppo").is_dir()


def _hide_incompatible_trl() -> None:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return
    if not has_value_head(Path(next(iter(spec.submodule_search_locations)))):
        sys.modules["trl"] = None  # type: ignore[assignment]


_hide_incompatible_trl()
