"""MkDocs hooks: pages whose figures and tables come from the code and the results files, at build time.

A page holds a marker; the build replaces it:

- ``<!-- settings-table -->`` — every setting of :mod:`dualmem.config` (name, environment variable, default, help);
- ``<!-- bench: NAME -->`` — the figures of ``benchmarks/results/NAME.json``, rendered by ``render_NAME`` below, each
  table followed by the command that produced it (the results file's ``command``).

No figure is typed into a page by hand; a marker naming a file that is absent, or a file without its command,
fails the build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARKER = re.compile(r"<!-- bench: ([a-z0-9_]+) -->")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(stats: dict[str, Any]) -> str:
    return f"{stats['p50_ms']:g} / {stats['p95_ms']:g}"


def render_store_bench(d: dict[str, Any]) -> str:
    """The retrieval paths of one persona inside the large shared table, and the load test."""
    rows = [[name, _ms(s), s["n"]] for name, s in d["latency"].items()]
    out = [
        f"{d['rows']:,} rows in {d['namespaces']} namespaces of {d['ns_items']:,} items; p50 / p95 in ms.", "",
        _table(["path", "p50 / p95 ms", "queries"], rows), "",
        f"Warm ranker / numpy p50: **{d['ratio_ranker_warm_to_numpy_p50']}×**; vector candidates / numpy: "
        f"**{d['ratio_candidates_warm_to_numpy_p50']}×** (target ≤ {d['targets']['ranker_warm_to_numpy_p50_max']}×); "
        f"a fresh worker's first search: **{d['fresh_worker_first_search_p50_ms']} ms** p50 "
        f"(target ≤ {d['targets']['fresh_worker_first_search_p50_ms_max']} ms).",
    ]  # fmt: skip
    load = d.get("load_test")
    if load:
        out += ["", f"Load test: 1 writer and {load['reader_processes']} reader processes for {load['seconds']:g} s.", "",
                _table(["errors", "stale reads", "commits seen", "staleness p50 / p95 / max ms", "reads/s", "writes/s"],
                       [[load["errors"], load["stale_reads"], load["commits_seen"],
                         f"{load['staleness_p50_ms']} / {load['staleness_p95_ms']} / {load['staleness_max_ms']}",
                         load["reads_per_s"], load["writes_per_s"]]])]  # fmt: skip
    return "\n".join(out)


def render_chat_latency(d: dict[str, Any]) -> str:
    """Time to first token of a create_agent reply with the middleware on and off."""
    rows = [[mode, _ms(m["ttft_off"]), _ms(m["ttft_on"]), _ms(m["ttft_added"])] for mode, m in d["modes"].items()]
    return "\n".join([
        f"Persona {d['persona']} ({d['namespace_items']['facts']:,} facts, {d['namespace_items']['insights']:,} insights), "
        f"a model answering after {d['model']['ttft_s']} s; {d['queries']} queries; p50 / p95 in ms.", "",
        _table(["agent", "TTFT off", "TTFT on", "added by memory"], rows), "",
        f"Retrieval alone: {_ms(d['retrieval_alone'])} ms (target: memory adds ≤ {d['target']['ttft_added_p50_ms']:g} ms p50).",
    ])  # fmt: skip


def render_writer_overhead(d: dict[str, Any]) -> str:
    """The writer's time per chunk outside the model call."""
    per = d["per_chunk_ms"]
    return "\n".join([
        f"{d['chunks']} chunks of RealMem {d['persona']} (first {d['sessions']} sessions), {d['items_written']} items written.", "",
        _table(["per chunk p50 ms", "p95 ms", "mean ms", "target p50 ms"], [[per["p50"], per["p95"], per["mean"], d["target"]["per_chunk_p50_ms_max"]]]),
    ])  # fmt: skip


def render_bench(name: str) -> str:
    """Return the markdown of one results file (its table and the command that produced it)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise ValueError(f"docs: benchmark marker {name!r} names {path}, which does not exist")
    data = json.loads(path.read_text())
    render: Callable[[dict[str, Any]], str] | None = globals().get(f"render_{name}")
    if render is None:
        raise ValueError(f"docs: no renderer render_{name} in docs/hooks.py")
    if not data.get("command"):
        raise ValueError(f"docs: {path} records no command; re-run its benchmark")
    return f"{render(data)}\n\nProduced by `{data['command']}` ({path.relative_to(REPO)}).\n"


def settings_table() -> str:
    """Return the table of every setting, from the code."""
    from dualmem.config import settings_table as rows

    return _table(["setting", "environment variable", "default", "what it does"],
                  [[f"`{name}`", f"`{var}`", f"`{default}`", text.replace("|", "\\|")] for name, var, default, text in rows()])  # fmt: skip


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the page's markers by tables built from the code and the results files."""
    markdown = markdown.replace("<!-- settings-table -->", settings_table())
    return MARKER.sub(lambda m: render_bench(m.group(1)), markdown)
