"""The API reference (docs/reference/*.md) documents exactly the public API: every name of each public module's
``__all__`` (the modules of test_api.PUBLIC), nothing else, each once.

Read from the pages' mkdocstrings directives, without building the site (the build is test_docs.py's):

- ``::: dualmem.stores`` with ``options: members: [...]`` — a public module and the names of its ``__all__`` it
  documents; the list is required (without it mkdocstrings would choose by its filters, not by ``__all__``), and
  ``members: false`` documents the module's docstring only;
- ``::: dualmem.chat.middleware.DualMemMiddleware`` — one name of a public module, documented where it is defined:
  for a name mkdocstrings cannot render from the module (a lazy ``__getattr__`` export, or a function named like the
  submodule that defines it, which griffe sees as the submodule).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from test_api import PUBLIC

REFERENCE = REPO / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: *(?P<id>[\w.]+)[ \t]*\n(?P<options>(?:(?:[ \t]+[^\n]*)?\n)*)", re.M)


def directives(pages: list[Path]) -> list[tuple[str, str, dict]]:
    """Return ``(page, identifier, options)`` of every ``:::`` directive of the pages."""
    out = []
    for page in pages:
        for m in DIRECTIVE.finditer(page.read_text()):
            block = yaml.safe_load(textwrap.dedent(m.group("options"))) or {}
            out.append((page.name, m.group("id"), block.get("options") or {}))
    return out


def problems(found: list[tuple[str, str, dict]]) -> list[str]:
    """Return what the directives document beyond or short of the public modules' ``__all__``."""
    import griffe

    package = griffe.load("dualmem", search_paths=[REPO])

    def resolve(path: str):
        try:
            return package if path == "dualmem" else package[path.removeprefix("dualmem.")]
        except KeyError:
            return None

    exports = {name: list(resolve(name).exports or []) for name in PUBLIC}
    documented: dict[str, list[str]] = {name: [] for name in PUBLIC}
    module_pages: dict[str, list[str]] = {name: [] for name in PUBLIC}
    out = []
    for page, ident, options in found:
        if ident in PUBLIC:
            module_pages[ident].append(page)
            members = options.get("members")
            if members is False:
                continue
            if not isinstance(members, list):
                out.append(f"{page}: `::: {ident}` needs `members:` listing its __all__ (or false), not {members!r}")
                continue
            for name in members:
                member = resolve(ident).members.get(name)
                documented[ident].append(name)
                if name in exports[ident] and (member is None or member.is_module):
                    out.append(
                        f"{page}: {ident}.{name} is invisible to mkdocstrings (lazy, or shadowed by a submodule): "
                        f"document it by its defining module's path, `::: {ident}.<module>.{name}`"
                    )
            continue
        home = max((name for name in PUBLIC if ident.startswith(name + ".")), key=len, default=None)
        obj = resolve(ident)
        if home is None:
            out.append(f"{page}: `::: {ident}` is outside the public modules {PUBLIC}")
            continue
        if obj is None or obj.is_module:
            out.append(f"{page}: `::: {ident}` names no object (a module that is not public, or nothing)")
            continue
        name = ident.rsplit(".", 1)[1]
        documented[home].append(name)
        public = resolve(home).members.get(name)
        if public is not None and not public.is_module and public.canonical_path != obj.canonical_path:
            out.append(f"{page}: `::: {ident}` is not {home}.{name} (that is {public.canonical_path})")
    for name in PUBLIC:
        if len(module_pages[name]) != 1:
            out.append(f"public module {name} has {len(module_pages[name])} `::: {name}` entries: {module_pages[name]}")
        names = documented[name]
        if missing := sorted(set(exports[name]) - set(names)):
            out.append(f"{name}: __all__ names missing from the reference: {missing}")
        if extra := sorted(set(names) - set(exports[name])):
            out.append(f"{name}: the reference documents names not in __all__: {extra}")
        if twice := sorted({n for n in names if names.count(n) > 1}):
            out.append(f"{name}: documented more than once: {twice}")
    return out


@pytest.fixture(scope="module")
def found() -> list[tuple[str, str, dict]]:
    return directives(sorted(REFERENCE.glob("*.md")))


def test_the_reference_documents_exactly_the_public_api(found):
    assert not problems(found)


def test_every_reference_page_is_in_the_nav():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    reference = next(item["API reference"] for item in nav if isinstance(item, dict) and "API reference" in item)
    listed = {path for item in reference for path in item.values()}
    assert listed == {f"reference/{p.name}" for p in REFERENCE.glob("*.md")}


def test_the_check_catches_a_missing_name_an_extra_name_and_a_private_module(found):
    less = [
        (p, i, {"members": [n for n in o["members"] if n != "open_store"]} if i == "dualmem.stores" else o)
        for p, i, o in found
    ]
    assert "dualmem.stores: __all__ names missing from the reference: ['open_store']" in problems(less)
    more = [*found, ("stores.md", "dualmem.stores.contract.GetItems", {})]
    assert "dualmem.stores: the reference documents names not in __all__: ['GetItems']" in problems(more)
    listed = [(p, i, {"members": [*o["members"], "Lease"]} if i == "dualmem.stores" else o) for p, i, o in found]
    assert "dualmem.stores: the reference documents names not in __all__: ['Lease']" in problems(listed)
    private = [*found, ("writer.md", "dualmem.memory.view", {})]
    assert any("dualmem.memory.view" in p for p in problems(private))
    shadowed = [(p, i, {"members": [*o["members"], "forget"]} if i == "dualmem.control" else o) for p, i, o in found]
    assert any("invisible to mkdocstrings" in p for p in problems(shadowed))
