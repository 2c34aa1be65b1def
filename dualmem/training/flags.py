"""Command-line flags of the training run configs: one ``--field value`` per dataclass field, clean errors."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from dualmem.errors import ConfigurationError


def parse_flags(cls: type, argv: list[str] | None = None, prog: str | None = None) -> Any:
    """Return ``cls`` built from ``--field value`` flags (``--help`` lists them); an unknown flag or a rejected value
    exits 2 with one line."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(cls, prog=prog)  # type: ignore[arg-type]
    for action in parser._actions:  # a literal "%" in a field's help would break argparse's formatting
        if action.help and "%" in action.help and "%(" not in action.help:
            action.help = action.help.replace("%", "%%")
    parser.error = _error  # type: ignore[method-assign]  # a bad value: one line, not the whole usage
    args = list(sys.argv[1:] if argv is None else argv)
    cfg, unknown = parser.parse_known_args(args=args)
    if unknown:
        flags = " ".join(a for a in unknown if a.startswith("-")) or " ".join(unknown)
        print(f"error: unknown flag(s) {flags}; see --help for the {cls.__name__} fields", file=sys.stderr)
        raise SystemExit(2)
    try:
        return cls(**vars(cfg))
    except ConfigurationError as exc:  # a value the config rejects (its __post_init__)
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
