"""Every `dualmem …` command line in the README names a real command, and every option it shows exists.

The lines are read from the README itself (code blocks and inline code), so a
renamed option or a removed command fails here rather than in a user's shell.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dualmem.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_command_lines() -> list[str]:
    text = README.read_text()
    lines: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block and line.strip().startswith("dualmem "):
            lines.append(line.strip())
    lines += [m.group(1) for m in re.finditer(r"`(dualmem [^`]+)`", text)]
    return sorted({ln.split(" #")[0].strip() for ln in lines})


def tokens(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def is_group(command) -> bool:
    return hasattr(command, "list_commands")  # typer's groups are not click's Group class


def context_of(command):
    return type(command).context_class(command) if hasattr(type(command), "context_class") else None


def resolve(line: str):
    """Return the command a README line names, its path, and the options it shows."""
    command = typer.main.get_command(app)
    path: list[str] = []
    words = tokens(line)[1:]
    for word in words:
        sub = command.get_command(context_of(command), word) if is_group(command) else None
        if sub is not None:
            command = sub
            path.append(word)
        elif not word.startswith("-"):
            break
    options = []
    for word in words:
        for part in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", word.strip("[]")):
            options.append(part)
    return command, path, options


LINES = readme_command_lines()


def test_the_readme_shows_commands():
    assert len(LINES) > 20, LINES


@pytest.mark.parametrize("line", LINES)
def test_readme_command_line_is_real(line):
    command, path, options = resolve(line)
    words = [w for w in tokens(line)[1:] if not w.startswith("-")]
    if words and is_group(command) and not command.invoke_without_command:
        assert path, f"README line {line!r}: no command {words[0]!r}"
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    unknown = [o for o in options if o not in known]
    assert not unknown, f"README line {line!r}: `dualmem {' '.join(path)}` has no option(s) {unknown}; it has {sorted(known)}"


@pytest.mark.parametrize("path", sorted({tuple(resolve(ln)[1]) for ln in LINES}))
def test_help_of_every_readme_command(path):
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
