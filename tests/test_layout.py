"""The code's layout as the README's Layout section states it: layers, no import cycles, small modules, the list complete."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dualmem"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, known: set[str]) -> set[str]:
    """Return the dualmem modules ``path`` imports anywhere (top level, functions, TYPE_CHECKING blocks)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("dualmem"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            found.update(n for n in names if n in known)
            if not any(n in known for n in names):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dualmem"))
    resolved = set()
    for name in found:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != "dualmem":
            resolved.add(name)
    return resolved


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, set(mods)) - {m} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one import cycle of ``graph`` (None when it has none)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _top(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _readme_layers() -> list[list[str]]:
    """Return the README Layout block's rows as lists of top-level names (``schema``, ``stores``, …), bottom layer first."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Layout\n.*?```\ndualmem/\n(.*?)\ntests/", text, re.S)
    assert block, "README has no Layout block"
    rows = []
    for line in block.group(1).splitlines():
        names = re.findall(
            r"(?:^|\s)([a-z_]+)(?:\.py|/)(?=\s|$)", line.split("  ", 2)[1] if line.startswith("  ") else line
        )
        rows.append(names)
    return rows


def test_no_import_cycles_between_modules():
    assert _cycle(_graph()) is None, f"import cycle: {' -> '.join(_cycle(_graph()) or [])}"


def test_no_import_cycles_between_packages():
    packages: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        packages.setdefault(_top(module), set()).update(_top(t) for t in targets if _top(t) != _top(module))
    assert _cycle(packages) is None, f"package import cycle: {' -> '.join(_cycle(packages) or [])}"


def test_every_module_is_under_400_lines():
    long = {
        str(p.relative_to(REPO)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) >= MAX_LINES
    }
    assert not long, f"modules of {MAX_LINES}+ lines: {long}"


def test_the_readme_layout_lists_every_package_and_module_and_its_layers_hold():
    rows = _readme_layers()
    listed = [name for row in rows for name in row]
    present = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    assert set(listed) == present, (
        f"README Layout lists {sorted(set(listed) - present)} that do not exist, misses {sorted(present - set(listed))}"
    )
    # a row of the block is one layer: modules import only from their own layer or those listed before it
    layer_of = {f"dualmem.{name}": i for i, row in enumerate(rows) for name in row}
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if module != "dualmem" and layer_of[_top(module)] < layer_of[_top(target)]
    )
    assert not upward, f"imports from a layer listed below the importer: {upward}"
