"""What the data generators' nodes share: one structured ask, one options parser.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Opts:
...     n: int = 1
...     sizes: tuple[int, ...] = (1, 2)
>>> options_of(Opts, {"sizes": [3]}, "demo")
Opts(n=1, sizes=(3,))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from dualmem.context import Context
from dualmem.errors import ConfigurationError
from dualmem.models.structured import Structured, invoke_structured

Opts = TypeVar("Opts")


def ask(ctx: Context, messages: list[Any], schema: type[BaseModel], *, judge: bool = False) -> Structured[Any]:
    """Ask the generator (or judge) model for ``schema`` with repairs (the run's retry settings)."""
    return invoke_structured(
        ctx.llm("judge") if judge else ctx.llm("chat"),
        messages,
        schema,
        retries=ctx.settings.tuning.max_retries,
        policy=ctx.settings,
    )


def options_of(cls: type[Opts], value: Opts | Mapping[str, Any] | None, what: str) -> Opts:
    """Return ``cls`` options from an object, a (JSON) dict or None; an unknown name raises, listing the valid ones."""
    if isinstance(value, cls):
        return value
    data = dict(cast(Mapping[str, Any], value or {}))
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - set(known)
    if unknown:
        raise ConfigurationError(f"unknown {what} option(s) {sorted(unknown)}; valid: {', '.join(known)}")
    return cls(**{k: tuple(v) if isinstance(known[k].default, tuple) else v for k, v in data.items()})
