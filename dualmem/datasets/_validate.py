"""Shared validation helpers of the dataset loaders: one-line errors, atomic writes.

Every loader reads a file with :func:`read_json`, validates the raw format with
a pydantic model through :func:`validate`, and every writer goes through
:func:`write_json_atomic`. Errors are :class:`~dualmem.errors.DatasetError`
(``file: $.json.path: expected X, found Y``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from dualmem.errors import DatasetError

T = TypeVar("T")


def json_path(loc: tuple[Any, ...] | list[Any], root: str = "$") -> str:
    """Render a location tuple (``("dialogues", 3, "speaker")``) as ``$.dialogues[3].speaker``."""
    out = root
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


def describe(value: Any, limit: int = 60) -> str:
    """Describe a found value in a short, readable way (type and a truncated repr)."""
    if value is None:
        return "null"
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )
    if isinstance(value, dict):
        return f"object with keys {sorted(value)[:6]}"
    if isinstance(value, list):
        return f"array of {len(value)}"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{kind} {text}"


def _expected(err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return f"key {str(err['loc'][-1])!r}"
    msg = str(err["msg"])
    for prefix in ("Input should be ", "Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    return msg


def error_from_validation(file: str | Path, exc: ValidationError, prefix: tuple[Any, ...] = ()) -> DatasetError:
    """Turn the first error of a pydantic ``ValidationError`` into a one-line ``DatasetError``."""
    err: dict[str, Any] = dict(exc.errors(include_url=False)[0])
    loc = tuple(prefix) + tuple(err["loc"])
    if err["type"] == "missing":
        return DatasetError(str(file), json_path(loc), _expected(err), "nothing (key missing)")
    return DatasetError(str(file), json_path(loc), _expected(err), describe(err.get("input")))


def validate(schema: type[T] | TypeAdapter[T], data: Any, file: str | Path, prefix: tuple[Any, ...] = ()) -> T:
    """Validate ``data`` against a pydantic model or adapter; raise a one-line ``DatasetError``."""
    try:
        if isinstance(schema, TypeAdapter):
            return schema.validate_python(data)
        assert issubclass(schema, BaseModel)
        return schema.model_validate(data)  # type: ignore[return-value]
    except ValidationError as exc:
        raise error_from_validation(file, exc, prefix) from None


def read_json(path: str | Path) -> Any:
    """Read a JSON file; invalid JSON raises ``DatasetError`` with its line and column."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(str(path), "$", "an existing JSON file", "no such file (check the path)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(str(path), "$", "UTF-8 text", f"undecodable byte at offset {exc.start}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(str(path), "$", "valid JSON", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        depth = _max_depth(text)
        raise DatasetError(
            str(path),
            "$",
            "JSON nested less than ~1,000 levels deep (dataset files nest < 10)",
            f"arrays/objects nested {depth:,} levels deep; is this the right file?",
        ) from None


def _max_depth(text: str) -> int:
    """Return how deep ``[``/``{`` nest in JSON text (strings skipped), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, ensure_ascii=False, indent=indent)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def json_files(path: str | Path, pattern: str = "*.json") -> list[Path]:
    """Return ``path`` itself if it is a file, else its matching files sorted by name."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p for p in path.glob(pattern) if p.is_file())
        if not found:
            raise DatasetError(str(path), "$", f"a folder with {pattern} files", "no matching file")
        return found
    if not path.exists():
        raise DatasetError(str(path), "$", "an existing file or folder", "no such path (check the path)")
    return [path]


def unique(values: list[str]) -> list[str]:
    """Return ``values`` without duplicates, first occurrence order kept."""
    return list(dict.fromkeys(values))
