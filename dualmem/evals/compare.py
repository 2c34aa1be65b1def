"""Compare runs: headline metrics and judges with deltas to the first run, per-category values with bars, per-query flips.

The first run given is the baseline. For each other run the comparison shows
each headline metric and judge mean with its difference to the baseline, the
task-type / category metric of its protocol per group (a bar in the terminal,
grouped bars in ``comparison.html``), and, where both runs hold records of the
same queries, how many queries turned from a miss into a hit in the top 10
(and back). A judge calibrated in its run shows its false-accept rate beside
its mean (``FA``); a last table sets quality against what it cost: tokens and
calls per query, per phase, the writer's input per history token, money.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualmem.evals import plots
from dualmem.evals.calibration import leniency
from dualmem.evals.drilldown import query_hit
from dualmem.evals.plots import GROUP_METRICS, group_series
from dualmem.evals.reports import (
    HEADLINE,
    RECORDS,
    fmt,
    md_table,
    quality_rows,
    read_records,
    read_summary,
    render_html,
)

BAR_WIDTH = 20


def delta(value: Any, base: Any) -> float | None:
    """Return ``value - base`` when both are finite numbers, else None."""
    ok = all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(float(x)) for x in (value, base)
    )
    return float(value) - float(base) if ok else None


def fmt_delta(d: float | None) -> str:
    """Format a difference with its sign ('' when there is none)."""
    return "" if d is None else f"{d:+.3f}"


def bar(value: Any, width: int = BAR_WIDTH) -> str:
    """Return a text bar of a 0-1 value (``█`` filled, ``·`` empty)."""
    if not isinstance(value, (int, float)) or math.isnan(float(value)):
        return "–"
    filled = round(max(0.0, min(1.0, float(value))) * width)
    return "█" * filled + "·" * (width - filled)


@dataclass
class Comparison:
    """Several runs side by side: headline rows with deltas, per-group rows, per-query flips."""

    labels: list[str]
    summaries: dict[str, dict[str, Any]]
    metric_keys: list[str]
    judge_keys: list[str]
    groups: dict[str, dict[str, dict[str, Any]]]  # metric -> group -> label -> value
    flips: dict[str, dict[str, int]]  # label -> {"gained", "lost", "same", "paired"}

    @property
    def baseline(self) -> str:
        """Return the label of the baseline run (the first)."""
        return self.labels[0]

    def _value(self, label: str, key: str) -> Any:
        s = self.summaries[label]
        if key in self.metric_keys:
            return s.get("overall", {}).get(key)
        return s.get("judges", {}).get(key, {}).get("mean")

    def headline_rows(self) -> tuple[list[str], list[list[Any]]]:
        """Return headers and rows: each metric and judge with ``value (Δ)`` for non-baseline runs."""
        keys = [*self.metric_keys, *self.judge_keys]
        headers = ["run", "framework", "dataset", "queries", *keys, "top-10 hits gained / lost vs baseline"]
        rows = []
        for label in self.labels:
            s = self.summaries[label]
            cells: list[Any] = [label, s.get("meta", {}).get("framework"), s.get("protocol"), s.get("n_queries")]
            for key in keys:
                value, d = self._value(label, key), delta(self._value(label, key), self._value(self.baseline, key))
                cells.append(
                    fmt(value)
                    + (f" ({fmt_delta(d)})" if label != self.baseline and d is not None else "")
                    + ("" if (fa := leniency(s.get("judge_calibration"), key)[0]) == "–" else f" [FA {fa}]")
                )
            f = self.flips.get(label)
            cells.append(
                "baseline"
                if label == self.baseline
                else (f"+{f['gained']} / -{f['lost']} of {f['paired']}" if f else "–")
            )
            rows.append(cells)
        return headers, rows

    def group_rows(self, metric: str) -> tuple[list[str], list[list[Any]]]:
        """Return headers and rows of one group metric: per group, each run's value and delta."""
        headers = ["group", *self.labels]
        rows = []
        for group, per_run in self.groups.get(metric, {}).items():
            cells: list[Any] = [group]
            for label in self.labels:
                value, d = per_run.get(label), delta(per_run.get(label), per_run.get(self.baseline))
                cells.append(fmt(value) + (f" ({fmt_delta(d)})" if label != self.baseline and d is not None else ""))
            rows.append(cells)
        return headers, rows

    def markdown(self) -> str:
        """Return the comparison as markdown tables."""
        headers, rows = self.headline_rows()
        parts = [md_table(headers, rows)]
        for metric in self.groups:
            parts += ["", f"### {metric} by task type / category (delta to {self.baseline})", ""]
            parts.append(md_table(*self.group_rows(metric)))
        if any(s.get("cost") for s in self.summaries.values()):
            parts += ["", "### Quality versus tokens", "", md_table(*quality_rows(self.summaries))]
        return "\n".join(parts)

    def rich_tables(self) -> list[Any]:
        """Return rich tables: headline with deltas, then each group metric with bars and deltas."""
        from rich.table import Table

        headers, rows = self.headline_rows()
        head = Table(title=f"DualMem runs (deltas to {self.baseline})")
        for h in headers:
            head.add_column(h, justify="left" if h in ("run", "framework", "dataset") else "right", overflow="fold")
        for row in rows:
            head.add_row(*(str(c) if c is not None else "–" for c in row))
        tables = [head]
        for metric, by_group in self.groups.items():
            table = Table(title=f"{metric} by task type / category")
            table.add_column("group")
            for label in self.labels:
                table.add_column(label, overflow="fold")
            for group, per_run in by_group.items():
                cells = []
                for label in self.labels:
                    d = delta(per_run.get(label), per_run.get(self.baseline))
                    extra = f" {fmt_delta(d)}" if label != self.baseline and d is not None else ""
                    cells.append(f"{bar(per_run.get(label))} {fmt(per_run.get(label))}{extra}")
                table.add_row(group, *cells)
            tables.append(table)
        if any(s.get("cost") for s in self.summaries.values()):
            headers, rows = quality_rows(self.summaries, quality=False)
            cost = Table(title="What the runs cost, per query (tokens, and by phase)")
            for h in headers:
                cost.add_column(h, justify="left" if h == "run" else "right", overflow="fold")
            for row in rows:
                cost.add_row(*(fmt(c) for c in row))
            tables.append(cost)
        return tables


def _flips(base: Path, other: Path) -> dict[str, int] | None:
    if not (base / RECORDS).exists() or not (other / RECORDS).exists():
        return None
    before = {(r.get("persona"), r.get("query_id")): query_hit(r) for r in read_records(base / RECORDS)}
    after = {(r.get("persona"), r.get("query_id")): query_hit(r) for r in read_records(other / RECORDS)}
    paired = [k for k in before if k in after and before[k] is not None and after[k] is not None]
    gained = sum(1 for k in paired if after[k] and not before[k])
    lost = sum(1 for k in paired if before[k] and not after[k])
    return {"gained": gained, "lost": lost, "same": len(paired) - gained - lost, "paired": len(paired)}


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [d.name for d in run_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def compare_runs(run_dirs: Sequence[str | Path]) -> Comparison:
    """Read several run folders and line them up against the first (see the module docstring)."""
    dirs = [Path(d) for d in run_dirs]
    labels = _labels(dirs)
    summaries = {label: read_summary(d) for label, d in zip(labels, dirs, strict=True)}
    metric_keys: list[str] = []
    judge_keys: list[str] = []
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for label, s in summaries.items():
        protocol = str(s.get("protocol", ""))
        metric_keys += [k for k in HEADLINE.get(protocol, ()) if k not in metric_keys]
        judge_keys += [k for k in s.get("judges", {}) if k not in judge_keys]
        for group, row in group_series(s)[1].items():
            for metric in GROUP_METRICS.get(protocol, ()):
                groups.setdefault(metric, {}).setdefault(group, {})[label] = row.get(metric)
    flips = {label: f for label, d in zip(labels[1:], dirs[1:], strict=True) if (f := _flips(dirs[0], d)) is not None}
    return Comparison(
        labels=labels, summaries=summaries, metric_keys=metric_keys, judge_keys=judge_keys, groups=groups, flips=flips
    )


def write_comparison(comparison: Comparison, out: str | Path) -> Path:
    """Write ``comparison.md`` and a self-contained ``comparison.html`` (per-category bars, radar, recall@k) into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels: Mapping[str, dict[str, Any]] = {
        f"{label} ({s.get('meta', {}).get('framework', '?')})": s for label, s in comparison.summaries.items()
    }
    md = "# DualMem run comparison\n\n" + comparison.markdown() + "\n"
    (out / "comparison.md").write_text(md, encoding="utf-8")
    (out / "comparison.html").write_text(
        render_html(md, plots.all_plots(labels), "DualMem run comparison"), encoding="utf-8"
    )
    return out
