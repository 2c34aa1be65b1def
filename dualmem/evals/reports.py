"""Run reports: per-query JSONL, ``summary.json``, ``report.md``, self-contained ``report.html``.

A run folder holds ``records.jsonl`` (one query per line), ``summary.json``
(the :func:`dualmem.evals.summary.summarize` output — with ``cost``, what the
run's model calls cost per phase — plus ``meta``: dataset, framework, models,
judges, LangSmith experiment, every setting, run segments, what re-running it
needs; and ``judge_calibration`` when the judge was calibrated),
``report.md`` and ``report.html``: the tables (each judge's measured leniency
beside its scores), the plots (base64 PNG, quality versus tokens across the
run's frameworks among them) and the per-query drill-down
(:mod:`dualmem.evals.drilldown`), with no external file.
Run comparison lives in :mod:`dualmem.evals.compare`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dualmem.datasets._validate import read_json
from dualmem.errors import ConfigurationError, DatasetError
from dualmem.evals import calibration as cal
from dualmem.evals import cost, plots
from dualmem.evals.drilldown import render_drilldown

RECORDS = "records.jsonl"
MAX_ERRORS_SHOWN = 20  # ingest errors listed in the report (all are in summary.json)
SUMMARY = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
HEADLINE = {
    "rolememo": ("fact_recall@10", "insight_recall@10"),
    "realmem": ("recall_any@5", "recall_any@10", "recall_all@10", "ndcg_any@10", "memory_point_recall"),
    "locomo": ("evidence_recall@5", "evidence_recall@10", "evidence_recall@20", "id_context_precision"),
}


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return str(value)


def _clean(value: Any) -> Any:
    """Replace NaN by None so that files are strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_records(path: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write records as JSON lines; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(_clean(rec), ensure_ascii=False, default=_json_default) + "\n")
    return path


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines records file."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """Read ``summary.json`` of a run folder (clear error when it is not one)."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise ConfigurationError(f"{path} not found: pass a folder written by `dualmem eval` (it holds {SUMMARY})")
    data = read_json(path)
    if not isinstance(data, dict):
        raise DatasetError(str(path), "$", "a run summary (a JSON object)", type(data).__name__)
    return data


def fmt(value: Any) -> str:
    """Format a metric value for tables (3 decimals, '–' when missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Return a GitHub-markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _metric_table(block: Mapping[str, Mapping[str, Any]], first: str) -> str:
    keys: list[str] = []
    for row in block.values():
        keys += [k for k in row if k not in keys and not k.startswith("n_")]
    return md_table([first, *keys], [[g, *(row.get(k) for k in keys)] for g, row in block.items()])


def _judge_table(judges: Mapping[str, Mapping[str, float]], calibration: Mapping[str, Any] | None = None) -> str:
    """Return a judge table; with a calibration, each judge's false-accept and false-reject rates beside its mean."""
    extra = ["false-accept (wrong)", "false-reject (faithful)"] if calibration else []
    return md_table(
        ["judge", "mean", "n", "errors", *extra],
        [
            [
                k,
                v.get("mean"),
                int(v.get("n", 0)),
                int(v.get("errors", 0)),
                *(cal.leniency(calibration, k) if extra else ()),
            ]
            for k, v in judges.items()
        ],
    )


def quality_rows(summaries: Mapping[str, Mapping[str, Any]], quality: bool = True) -> tuple[list[str], list[list[Any]]]:
    """Return headers and rows of quality versus tokens: each run's headline metrics and judges (unless not ``quality``),
    tokens and calls per query, per phase, the writer's input per history token, money."""
    keys = [k for s in summaries.values() for k in HEADLINE.get(str(s.get("protocol")), ())[:2]] if quality else []
    judges = [k for s in summaries.values() for k in s.get("judges", {})] if quality else []
    keys, judges = list(dict.fromkeys(keys)), list(dict.fromkeys(judges))
    rows = []
    for label, s in summaries.items():
        c = s.get("cost") or {}
        whole, n = c.get("total") or {}, int(s.get("n_queries") or 0)
        rows.append(
            [
                label,
                *(s.get("overall", {}).get(k) for k in keys),
                *(s.get("judges", {}).get(k, {}).get("mean") for k in judges),
                round(c["tokens_per_query"]) if c.get("tokens_per_query") is not None else None,
                round(whole["calls"] / n, 2) if whole and n else None,
                *(round(cost.tokens(c["phases"][p]) / n) if c and n else None for p in cost.PHASES),
                c.get("writer_input_per_history_token"),
                (c.get("money") or {}).get("total"),
            ]
        )
    return [
        "run",
        *keys,
        *judges,
        "tokens / query",
        "calls / query",
        *(f"{p} tokens / query" if quality else p for p in cost.PHASES),
        "writer input / history token",
        "money",
    ], rows


def render_markdown(summary: Mapping[str, Any], peers: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """Return ``report.md`` text of one run summary (``peers``: the summaries of the frameworks run with it)."""
    meta = summary.get("meta", {})
    protocol = summary.get("protocol", "")
    parts = [f"# DualMem evaluation — {protocol} × {meta.get('framework', '?')}", ""]
    parts += [f"- {k}: `{v}`" for k, v in meta.items() if not isinstance(v, (dict, list)) and v is not None]
    if meta.get("langsmith"):
        parts.append("- LangSmith: " + ", ".join(f"{k} `{v}`" for k, v in meta["langsmith"].items()))
    if meta.get("run"):
        run = meta["run"]
        parts.append(
            f"- run `{run.get('fingerprint')}` created {run.get('created')}, {run.get('segments')} segment(s) "
            f"(resumed {max(0, int(run.get('segments') or 1) - 1)} time(s)), dualmem revision `{run.get('dualmem_revision')}`"
        )
    parts += [
        f"- queries: {summary.get('n_queries')} over {summary.get('n_personas')} persona(s); "
        f"queries with errors: {summary.get('n_query_errors')}",
        "",
    ]
    parts += ["## Overall", "", _metric_table({"overall": summary.get("overall", {})}, "scope"), ""]
    for key, title, first in (
        ("by_task_type", "By task type", "task type"),
        ("by_category", "By category", "category"),
        ("per_persona", "Per persona", "persona"),
    ):
        if summary.get(key):
            parts += [f"## {title}", "", _metric_table(summary[key], first), ""]
    if protocol == "locomo":
        adv = summary.get("adversarial", {})
        parts += ["## Category 5 (adversarial, reported apart)", "", f"{adv.get('n', 0)} queries", ""]
        if adv.get("metrics"):
            parts += [_metric_table({"cat 5": adv["metrics"]}, "scope"), ""]
        if adv.get("judges"):
            parts += [_judge_table(adv["judges"], summary.get("judge_calibration")), ""]
    calibration = summary.get("judge_calibration")
    if summary.get("judges"):
        parts += ["## LLM judges", "", _judge_table(summary["judges"], calibration), ""]
        parts += (
            [*(f"**{w}**" for w in cal.warnings(calibration)), ""] if calibration and calibration.get("lenient") else []
        )
    if calibration:
        parts += cal.render_markdown(calibration, md_table, warn=False)
    if summary.get("cost"):
        parts += cost.render_markdown(summary["cost"], md_table)
        parts += [
            "### Quality versus tokens" + (" (the frameworks of this run)" if len(peers or {}) > 1 else ""),
            "",
            md_table(*quality_rows(peers or {str(meta.get("framework", "run")): summary})),
            "",
        ]
    if summary.get("ragas"):
        rg = summary["ragas"]
        parts += [
            "## ragas ID-based context metrics (recomputed with ragas, micro mean)",
            "",
            md_table(list(rg), [list(rg.values())]),
            "",
        ]
    if summary.get("ingest"):
        ingest = {k: v for k, v in summary["ingest"].items() if k != "errors"}
        parts += ["## Ingest", "", md_table(list(ingest), [list(ingest.values())]), ""]
        errors = summary["ingest"].get("errors") or []
        if errors:
            rows = [
                [e["session"], e["chunk"] or "(whole session)", str(e["error"]).replace("|", "/")]
                for e in errors[:MAX_ERRORS_SHOWN]
            ]
            more = f" ({len(errors) - MAX_ERRORS_SHOWN} more in summary.json)" if len(errors) > MAX_ERRORS_SHOWN else ""
            parts += [f"### Ingest errors{more}", "", md_table(["session", "chunk", "error"], rows), ""]
    if meta.get("reproducibility"):
        rep = meta["reproducibility"]
        rows = [[f"version {k}", v] for k, v in rep["versions"].items()] + [
            [f"model {k}", v] for k, v in rep["models"].items()
        ]
        rows += [
            ["endpoint", rep["endpoint"]],
            ["dataset sha256", rep["dataset"]["sha256"]],
            ["dualmem revision", rep["dualmem_revision"]],
        ]
        rows += [[f"seed {k}", v] for k, v in rep["seeds"].items()] + [
            [f"prompts {k}", v] for k, v in rep["prompts"].items()
        ]
        parts += ["## Reproducibility", "", md_table(["what", "value"], rows), ""]
    if meta.get("settings"):
        parts += [
            "## Settings",
            "",
            md_table(["setting", "value"], [[k, repr(v)] for k, v in meta["settings"].items()]),
            "",
        ]
    return "\n".join(parts)


def _md_to_html(md: str) -> str:
    """Convert the small markdown subset used by reports (headings, bullets, tables) to HTML."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if table:
            head, *body = table
            out.append(
                "<table><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
                + "</table>"
            )
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= {"-"} for c in cells):
                table.append(cells)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<li>{html.escape(line[2:]).replace('`', '')}</li>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


STYLE = (
    "body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}img{max-width:100%}"
)


def render_html(markdown: str, figures: Mapping[str, bytes], title: str = "DualMem evaluation", extra: str = "") -> str:
    """Return a self-contained HTML page: the markdown report, the figures as base64 PNG, then ``extra`` HTML."""
    imgs = "\n".join(
        f'<figure><img alt="{html.escape(name)}" id="{html.escape(name)}" src="{plots.data_uri(png)}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, png in figures.items()
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{_md_to_html(markdown)}<h2>Figures</h2>{imgs}{extra}</body></html>"
    )


def write_report(
    run_dir: str | Path,
    summary: Mapping[str, Any],
    records: Iterable[Mapping[str, Any]] | None = None,
    peers: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Write records (if given), ``summary.json``, ``report.md`` and ``report.html`` (with the query drill-down); return the
    folder. ``peers``: the summaries of the frameworks run together with this one (quality versus tokens across them)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if records is not None:
        records = list(records)
        write_records(run_dir / RECORDS, records)
    elif (run_dir / RECORDS).exists():
        records = read_records(run_dir / RECORDS)
    (run_dir / SUMMARY).write_text(
        json.dumps(_clean(summary), indent=2, ensure_ascii=False, default=_json_default), encoding="utf-8"
    )
    markdown = render_markdown(summary, peers)
    (run_dir / REPORT_MD).write_text(markdown, encoding="utf-8")
    label = str(summary.get("meta", {}).get("framework", run_dir.name))
    figures = plots.all_plots({label: summary})
    if peers and (across := plots.quality_vs_tokens(peers)) is not None:
        figures["quality_vs_tokens"] = across
    drill = render_drilldown(records) if records else ""
    (run_dir / REPORT_HTML).write_text(render_html(markdown, figures, extra=drill), encoding="utf-8")
    return run_dir


def write_calibration(out: str | Path, calibration: Mapping[str, Any]) -> Path:
    """Write a judge calibration (``dualmem eval calibrate-judge``) as ``calibration.json``, ``.md`` and ``.html``; return ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(
        json.dumps(_clean(calibration), indent=2, ensure_ascii=False, default=_json_default), encoding="utf-8"
    )
    markdown = "\n".join(["# DualMem judge calibration", "", *cal.render_markdown(calibration, md_table)])
    (out / "calibration.md").write_text(markdown, encoding="utf-8")
    (out / "calibration.html").write_text(render_html(markdown, {}, "DualMem judge calibration"), encoding="utf-8")
    return out
