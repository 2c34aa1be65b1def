"""Report figures (matplotlib, Agg backend): recall by task type / category, per persona, judge radar, recall@k curves,
quality versus tokens.

Every function takes ``{label: summary}`` (one summary per framework/run) and
returns PNG bytes, or None when the summaries hold nothing to draw.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dualmem.evals.judges import ROLEPLAY_KEYS

Summaries = Mapping[str, Mapping[str, Any]]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    """Return a base64 ``data:`` URI of PNG bytes, for self-contained HTML."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(float(x))


MAX_BARS = 40  # more groups than this are drawn as a sorted curve: a figure's size never grows with the personas
GROUP_METRICS = {
    "rolememo": ("fact_recall@10", "insight_recall@10"),
    "realmem": ("recall_any@10",),
    "locomo": ("evidence_recall@10",),
}


def group_series(summary: Mapping[str, Any], by: str = "category") -> tuple[str, dict[str, dict[str, float]]]:
    """Return (title, {group: {metric: value}}) of a summary by task type / category (``by="category"``) or persona."""
    protocol = str(summary.get("protocol"))
    metrics = GROUP_METRICS.get(protocol, ())
    if by == "persona":
        block, title = summary.get("per_persona", {}), f"{', '.join(metrics)} per persona"
    else:
        block = summary.get("by_task_type" if protocol == "rolememo" else "by_category", {})
        title = f"{', '.join(metrics)} by {'task type' if protocol == 'rolememo' else 'category'}"
    return title, {g: {k: row.get(k, float("nan")) for k in metrics} for g, row in block.items()}


def recall_by_group(summaries: Summaries, by: str = "category") -> bytes | None:
    """Return grouped bars of recall per task type / category (or persona), one colour per run and metric."""
    series: dict[str, dict[str, float]] = {}
    title = ""
    groups: list[str] = []
    for label, summary in summaries.items():
        title, by_group = group_series(summary, by)
        for g, row in by_group.items():
            if g not in groups:
                groups.append(g)
            for metric, value in row.items():
                series.setdefault(f"{label} · {metric}", {})[g] = value
    if not groups or not any(_finite(v) for row in series.values() for v in row.values()):
        return None
    if len(groups) > MAX_BARS:  # many personas: their distribution, in a figure of fixed size
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, row in series.items():
            ys = sorted((v for v in row.values() if _finite(v)), reverse=True)
            ax.plot(range(1, len(ys) + 1), ys, label=name)
        ax.set_xlabel(f"{len(groups)} {'personas' if by == 'persona' else 'groups'}, best first")
        ax.set_ylim(0, 1.05)
        ax.set_title(title)
        ax.legend(fontsize=7)
        return _png(fig)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(groups)), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, row) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [row.get(g, 0.0) if _finite(row.get(g)) else 0.0 for g in groups], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _png(fig)


def judge_radar(summaries: Summaries, keys: tuple[str, ...] = ROLEPLAY_KEYS, scale: float = 5.0) -> bytes | None:
    """Return a radar chart of the four role-play judge dimensions, one polygon per run."""
    rows = {label: [s.get("judges", {}).get(k, {}).get("mean") for k in keys] for label, s in summaries.items()}
    rows = {label: vals for label, vals in rows.items() if any(_finite(v) for v in vals)}
    if not rows:
        return None
    angles = [2 * math.pi * i / len(keys) for i in range(len(keys))]
    fig = plt.figure(figsize=(5, 5))
    ax = fig.add_subplot(111, polar=True)
    for label, vals in rows.items():
        ys = [float(v) if _finite(v) else 0.0 for v in vals]
        ax.plot([*angles, angles[0]], [*ys, ys[0]], label=label)
        ax.fill([*angles, angles[0]], [*ys, ys[0]], alpha=0.15)
    ax.set_xticks(angles, [k.replace("_", "\n") for k in keys], fontsize=8)
    ax.set_ylim(0, scale)
    ax.set_title("Role-play judge (0-5)")
    ax.legend(loc="lower right", fontsize=7, bbox_to_anchor=(1.3, -0.1))
    return _png(fig)


def _at_k(overall: Mapping[str, Any]) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    for key, value in overall.items():
        found = re.fullmatch(r"(.+)@(\d+)", key)
        if found and _finite(value):
            curves.setdefault(found.group(1), []).append((int(found.group(2)), float(value)))
    return {name: sorted(pts) for name, pts in curves.items() if len(pts) > 1}


def recall_at_k(summaries: Summaries) -> bytes | None:
    """Return recall@k curves (every ``metric@k`` family with several k) of each run's overall metrics."""
    lines = {(label, name): pts for label, s in summaries.items() for name, pts in _at_k(s.get("overall", {})).items()}
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for (label, name), pts in lines.items():
        ax.plot([k for k, _ in pts], [v for _, v in pts], marker="o", label=f"{label} · {name}")
    ax.set_xlabel("k")
    ax.set_ylim(0, 1.05)
    ax.set_title("Recall@k")
    ax.legend(fontsize=7)
    return _png(fig)


def quality_vs_tokens(summaries: Summaries) -> bytes | None:
    """Return each run's headline metric (and first judge's mean, on its right axis) against its tokens per query."""
    points: dict[str, tuple[Any, Any, Any]] = {}
    for label, s in summaries.items():
        if (s.get("cost") or {}).get("tokens_per_query") is not None:
            first_judge: Mapping[str, Any] = next(iter((s.get("judges") or {}).values()), {})
            points[label] = (
                s["cost"]["tokens_per_query"],
                s.get("overall", {}).get(GROUP_METRICS.get(str(s.get("protocol")), ("",))[0]),
                first_judge.get("mean"),
            )
    if not points:
        return None
    protocol = str(next(iter(summaries.values())).get("protocol"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    judged = ax.twinx() if any(_finite(p[2]) for p in points.values()) else None
    for label, (x, metric, judge) in points.items():
        if _finite(metric):
            ax.scatter([x], [metric], marker="o")
            ax.annotate(label, (x, metric), fontsize=7, xytext=(4, 4), textcoords="offset points")
        if judged is not None and _finite(judge):
            judged.scatter([x], [judge], marker="x", color="grey")
    ax.set_xlabel("tokens per query (writing + retrieval + answering + judging)")
    ax.set_ylabel(f"{GROUP_METRICS.get(protocol, ('quality',))[0]} (o)")
    if judged is not None:
        judged.set_ylabel(f"{next(iter(next(iter(summaries.values())).get('judges') or {'judge': 0}))} mean (x)")
    ax.set_title("Quality versus tokens: what each framework's score costs")
    return _png(fig)


def all_plots(summaries: Summaries) -> dict[str, bytes]:
    """Return every drawable figure as ``{name: png}``."""
    several = any(len(s.get("per_persona") or {}) > 1 for s in summaries.values())
    figures = {
        "recall_by_group": recall_by_group(summaries),
        "recall_per_persona": recall_by_group(summaries, by="persona") if several else None,
        "judge_radar": judge_radar(summaries),
        "recall_at_k": recall_at_k(summaries),
        "quality_vs_tokens": quality_vs_tokens(summaries),
    }
    return {k: v for k, v in figures.items() if v is not None}
