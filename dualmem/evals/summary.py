"""Aggregate per-query records into a run summary (pure functions, JSON-able output).

RealMem: per persona, then macro over personas (its protocol), and per
query category. RoleMemo: micro over gold items, overall and per task type.
LoCoMo: categories 1-4 scored together and per category (by name:
multi-hop, temporal, open-domain, single-hop), category 5 (adversarial)
reported apart. Judge scores are averaged per key over the queries where they
succeeded; failures are counted, never averaged in as zeros.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dualmem.evals import metrics as m
from dualmem.evals.cost import cost_summary
from dualmem.evals.runners import category_name, ragas_ids

ROLEMEMO_SCALARS = ("fact_recall@10", "insight_recall@10")


def group_label(record: Mapping[str, Any]) -> str | None:
    """Return the group a record is reported under: its task type (RoleMemo) or its category by name."""
    if record.get("task_type"):
        return str(record["task_type"])
    return record.get("category_name") or category_name(record.get("protocol"), record.get("category"))


def numeric_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Return the scalar metric values of a record (lists and counts-only fields dropped)."""
    return {
        k: float(v)
        for k, v in record.get("metrics", {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def judge_means(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Return ``{judge key: {"mean", "n", "errors"}}`` over ``records``."""
    scores: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    for rec in records:
        for key, res in rec.get("judges", {}).items():
            if res.get("score") is None:
                errors[key] += 1
            else:
                scores[key].append(float(res["score"]))
    keys = sorted(set(scores) | set(errors))
    return {k: {"mean": m.mean(scores[k]), "n": float(len(scores[k])), "errors": float(errors[k])} for k in keys}


def _rolememo_block(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = [r["metrics"] for r in records if "fact_total" in r.get("metrics", {})]
    types = [r.get("task_type") for r in records if "fact_total" in r.get("metrics", {})]
    agg = m.aggregate_rolememo(rows, types)
    extra = m.average_metrics(
        [{k: v for k, v in numeric_metrics(r).items() if k.startswith("id_context")} for r in records]
    )
    return {"overall": {**agg["overall"], **extra}, "by_task_type": agg["by_task_type"]}


def _group(records: Sequence[Mapping[str, Any]], key: str) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in records:
        label = group_label(rec) if key == "category" else rec.get(key)
        groups[str(label)].append(rec)
    return dict(sorted(groups.items()))


def summarize(
    protocol: str,
    records: Sequence[Mapping[str, Any]],
    ingest: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    cost: Mapping[str, Mapping[str, Any] | None] | None = None,
    prices: str = "",
) -> dict[str, Any]:
    """Return the summary of one run's records (see the module docstring for each protocol); with the units' ``cost``
    (per persona), what the run's calls cost (:func:`dualmem.evals.cost.cost_summary`, money by ``prices``)."""
    by_persona = _group(records, "persona")
    out: dict[str, Any] = {
        "protocol": protocol,
        "n_queries": len(records),
        "n_personas": len(by_persona),
        "n_query_errors": sum(1 for r in records if r.get("errors")),
        "judges": judge_means(records),
    }
    if protocol == "realmem":
        per = {
            p: m.average_metrics([numeric_metrics(r) for r in rs if r.get("metrics")]) for p, rs in by_persona.items()
        }
        out["per_persona"] = per
        out["overall"] = m.macro_average(per)
        out["micro"] = m.average_metrics([numeric_metrics(r) for r in records if r.get("metrics")])
        out["by_category"] = {
            c: m.average_metrics([numeric_metrics(r) for r in rs if r.get("metrics")])
            for c, rs in _group(records, "category").items()
        }
        out["judges_by_category"] = {c: judge_means(rs) for c, rs in _group(records, "category").items()}
    elif protocol == "locomo":
        scored = [r for r in records if r.get("scored", True)]
        out["overall"] = m.average_metrics([numeric_metrics(r) for r in scored])
        out["by_category"] = {
            c: m.average_metrics([numeric_metrics(r) for r in rs]) for c, rs in _group(records, "category").items()
        }
        adversarial = [r for r in records if not r.get("scored", True)]
        out["adversarial"] = {
            "n": len(adversarial),
            "metrics": m.average_metrics([numeric_metrics(r) for r in adversarial]),
            "judges": judge_means(adversarial),
        }
        out["judges"] = judge_means(scored)
        out["per_persona"] = {
            p: m.average_metrics([numeric_metrics(r) for r in rs if r.get("scored", True)])
            for p, rs in by_persona.items()
        }
        out["judges_by_category"] = {c: judge_means(rs) for c, rs in _group(records, "category").items()}
    elif protocol == "rolememo":
        block = _rolememo_block(records)
        out["overall"] = block["overall"]
        out["by_task_type"] = block["by_task_type"]
        out["per_persona"] = {p: _rolememo_block(rs)["overall"] for p, rs in by_persona.items()}
        out["judges_by_task_type"] = {t: judge_means(rs) for t, rs in _group(records, "task_type").items()}
    else:
        raise ValueError(f"unknown protocol {protocol!r}; use realmem, locomo or rolememo")
    if ingest is not None:
        logs = [row for rows in ingest.values() for row in rows]
        out["ingest"] = {
            "sessions": len(logs),
            "items_written": sum(int(r.get("items", 0)) for r in logs),
            "failed_chunks": sum(len(r.get("failed_chunks", [])) for r in logs),
            "failed_sessions": [r["session"] for r in logs if "error" in r],
            "errors": [
                {"session": r["session"], "chunk": chunk, "error": error}
                for r in logs
                for chunk, error in r.get("chunk_errors", {}).items()
            ]
            + [{"session": r["session"], "chunk": None, "error": r["error"]} for r in logs if "error" in r],
            "seconds": round(sum(float(r.get("seconds", 0.0)) for r in logs), 3),
        }
    if cost is not None:
        out["cost"] = cost_summary(cost, len(records), prices)
    return out


def ragas_crosscheck(records: Sequence[Mapping[str, Any]], recall_k: int = 10) -> dict[str, Any]:
    """Recompute ID-based context recall/precision with ragas itself (micro mean) and check agreement."""

    pairs = [p for r in records if r.get("scored", True) and (p := ragas_ids(dict(r), recall_k))]
    scored = m.ragas_id_scores_batch(pairs)
    if scored is None:
        return {
            "backend": "unavailable: ragas does not import; values computed by dualmem.evals.metrics",
            "n": len(pairs),
        }
    ours = [m.ragas_id_scores(*p) for p in pairs]
    agree = all(
        (math.isnan(a[k]) and math.isnan(b[k])) or abs(a[k] - b[k]) < 1e-9
        for a, b in zip(scored, ours, strict=True)
        for k in a
    )
    import ragas

    return {
        "backend": f"ragas {ragas.__version__}",
        "n": len(pairs),
        "id_context_recall": m.mean(s["id_context_recall"] for s in scored),
        "id_context_precision": m.mean(s["id_context_precision"] for s in scored),
        "agrees_with_dualmem": agree,
    }
