"""Every `dualmem …` command line in the README and the docs names a real command, and every option it shows exists.

The lines are read from the pages themselves (code blocks, continuation lines
joined, commands after a pipe or `&&` included, and inline code), so a renamed
option or a removed command fails here rather than in a user's shell. Commands
that forward ``--field value`` flags to a config dataclass (``dualmem train sft``
and ``rl``) accept the fields their ``--help`` lists.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dualmem.cli import app

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SEPARATORS = re.compile(r"\s(?:&&|\|\||\||;)\s")


def page_command_lines(page: Path) -> list[str]:
    """Return the `dualmem …` command lines of one page."""
    text = page.read_text()
    lines: list[str] = []
    in_block = False
    joined = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        joined += line.strip()
        if joined.endswith("\\"):  # a continued shell line
            joined = joined[:-1] + " "
            continue
        for part in SEPARATORS.split(joined.split(" #")[0]):
            if part.strip().startswith("dualmem "):
                lines.append(part.strip())
        joined = ""
    lines += [m.group(1) for m in re.finditer(r"`(dualmem [^`]+)`", text)]
    return [ln.split(" #")[0].strip() for ln in lines]


def readme_command_lines() -> list[str]:
    return sorted({line for page in PAGES for line in page_command_lines(page)})


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


def test_the_pages_show_commands():
    assert len(LINES) > 20, LINES
    assert all(
        page_command_lines(REPO / "docs" / name)
        for name in ("getting-started.md", "training.md", "guides/evaluation.md")
    )


@pytest.mark.parametrize("line", LINES)
def test_readme_command_line_is_real(line):
    command, path, options = resolve(line)
    words = [w for w in tokens(line)[1:] if not w.startswith("-")]
    if words and is_group(command) and not command.invoke_without_command:
        assert path, f"docs line {line!r}: no command {words[0]!r}"
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    if (command.context_settings or {}).get("allow_extra_args"):  # flags forwarded to a config dataclass
        known |= {f"--{name}" for name in re.findall(r"--(\w+) \(default", command.help or "")}
    unknown = [o for o in options if o not in known]
    assert not unknown, (
        f"docs line {line!r}: `dualmem {' '.join(path)}` has no option(s) {unknown}; it has {sorted(known)}"
    )


@pytest.mark.parametrize("path", sorted({tuple(resolve(ln)[1]) for ln in LINES}))
def test_help_of_every_readme_command(path):
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
