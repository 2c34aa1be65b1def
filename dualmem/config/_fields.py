"""How a setting is declared: its default, its environment variable, its help, and the checks of its value."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field, fields
from typing import Any

from dualmem.errors import ConfigurationError

ENV_PREFIX = "DUALMEM_"
# fields read from a non-prefixed, conventional environment variable
ENV_ALIASES = {"openai_base_url": "OPENAI_BASE_URL", "openai_api_key": "OPENAI_API_KEY"}


def _env(name: str, default: Any, kind: type) -> Any:
    var = ENV_ALIASES.get(name, ENV_PREFIX + name.upper())
    raw = os.environ.get(var)
    if raw is None or raw == "":
        return default
    try:
        if kind is bool:
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{var}={raw!r} is not a valid {kind.__name__}; fix or unset it") from exc
    return raw


def _setting(default: Any, help: str, kind: type = str, secret: bool = False) -> Any:
    """Declare a field whose default is overridden by its environment variable (``secret``: left out of the repr)."""
    holder: dict[str, str] = {}

    def factory() -> Any:
        return _env(holder["name"], default, kind)

    return field(
        default_factory=factory, repr=not secret, metadata={"help": help, "env_default": default, "holder": holder}
    )


def _check(obj: Any, choices: dict[str, tuple[Any, ...]], at_least: dict[str, int]) -> None:
    """Raise :class:`ConfigurationError` naming the fix when a field is not one of its choices or below its bound."""
    for name, allowed in choices.items():
        if getattr(obj, name) not in allowed:
            raise ConfigurationError(
                f"setting {name}={getattr(obj, name)!r} is not one of {allowed}; "
                f"set {ENV_PREFIX}{name.upper()} or pass {name}= to one of them"
            )
    for name, low in at_least.items():
        if getattr(obj, name) < low:
            raise ConfigurationError(f"setting {name} must be >= {low}, got {getattr(obj, name)}")


class _Options:
    """What the two option objects share: ``replace`` with a clear error on unknown names."""

    def replace(self, **changes: Any) -> Any:
        """Return a copy with ``changes`` applied (unknown names raise)."""
        unknown = set(changes) - {f.name for f in fields(self)}  # type: ignore[arg-type]
        if unknown:
            raise ConfigurationError(
                f"unknown settings {sorted(unknown)}; see `dualmem --help` or the configuration page"
            )
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]
