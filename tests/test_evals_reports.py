"""Summaries and reports on hand-made records: protocol aggregation, strict JSON, self-contained HTML."""

from __future__ import annotations

import json

import pytest

from dualmem.evals.compare import compare_runs
from dualmem.evals.reports import read_summary, write_report
from dualmem.evals.summary import summarize


def rec(persona, metrics, **kw):
    return {
        "persona": persona,
        "query_id": kw.pop("qid", "q"),
        "metrics": metrics,
        "judges": kw.pop("judges", {}),
        "errors": kw.pop("errors", []),
        **kw,
    }


def test_realmem_summary_is_macro_over_personas():
    records = [
        rec("p1", {"recall_any@5": 1.0}),
        rec("p1", {"recall_any@5": 1.0}),
        rec("p1", {"recall_any@5": 1.0}),
        rec("p2", {"recall_any@5": 0.0}),
        rec("p2", {}),
    ]  # a query without gold contributes nothing
    s = summarize("realmem", records)
    assert s["per_persona"] == {"p1": {"recall_any@5": 1.0}, "p2": {"recall_any@5": 0.0}}
    assert s["overall"]["recall_any@5"] == 0.5 and s["micro"]["recall_any@5"] == 0.75


def test_locomo_summary_reports_category_5_apart_and_judge_errors():
    ok = {"key": "locomo_correctness", "score": 1.0}
    err = {"key": "locomo_correctness", "score": None, "comment": "error: unparseable"}
    records = [
        rec(
            "c",
            {"evidence_recall@5": 1.0},
            category="1",
            scored=True,
            judges={"locomo_correctness": ok},
            protocol="locomo",
        ),
        rec(
            "c",
            {"evidence_recall@5": 0.0},
            category="2",
            scored=True,
            judges={"locomo_correctness": err},
            protocol="locomo",
        ),
        rec(
            "c",
            {"evidence_recall@5": 0.0},
            category="5",
            scored=False,
            judges={"locomo_correctness": ok},
            protocol="locomo",
        ),
    ]
    s = summarize("locomo", records)
    assert s["overall"]["evidence_recall@5"] == 0.5  # category 5 left out
    assert s["adversarial"]["n"] == 1 and s["adversarial"]["metrics"]["evidence_recall@5"] == 0.0
    assert s["by_category"]["adversarial"]["evidence_recall@5"] == 0.0  # categories by name, not "1", "5"
    assert sorted(s["by_category"]) == ["adversarial", "multi-hop", "temporal"]
    assert s["judges_by_category"]["multi-hop"]["locomo_correctness"]["mean"] == 1.0
    # the failed verdict is counted as an error, never averaged in as a zero
    assert s["judges"]["locomo_correctness"] == {"mean": 1.0, "n": 1.0, "errors": 1.0}


def test_rolememo_summary_and_report_files(tmp_path):
    def rm(hits, total, ihit, tt, score):
        return rec(
            "p",
            {
                "fact_total": total,
                "fact_hit_count": hits,
                "insight_total": 1,
                "insight_hit_count": ihit,
                "fact_recall": hits / total,
                "insight_recall": float(ihit),
                "id_context_recall": float("nan"),
            },
            task_type=tt,
            judges={"logical_quality": {"key": "logical_quality", "score": score}},
        )

    records = [rm(1, 2, 1, "Value Judgment", 4.0), rm(2, 2, 0, "Decision Guidance", 2.0)]
    ingest = {
        "p": [
            {
                "session": "s1",
                "items": 3,
                "failed_chunks": ["c1"],
                "chunk_errors": {"c1": "ValidationError: facts | missing"},
                "seconds": 1.0,
            },
            {"session": "s2", "error": "RuntimeError: store gone"},
        ]
    }
    s = summarize("rolememo", records, ingest=ingest)
    assert s["ingest"]["errors"] == [
        {"session": "s1", "chunk": "c1", "error": "ValidationError: facts | missing"},
        {"session": "s2", "chunk": None, "error": "RuntimeError: store gone"},
    ]
    assert s["ingest"]["failed_sessions"] == ["s2"]
    assert s["overall"]["fact_recall@10"] == 0.75 and s["overall"]["insight_recall@10"] == 0.5
    assert s["by_task_type"]["Decision Guidance"]["insight_recall@10"] == 0.0
    assert s["ingest"]["failed_chunks"] == 1 and s["judges"]["logical_quality"]["mean"] == 3.0
    s["meta"] = {"framework": "dualmem", "similarity_embedder": "all-MiniLM-L6-v2 (bundled)"}
    run = write_report(tmp_path / "run", s, records)
    raw = (run / "summary.json").read_text()
    assert "NaN" not in raw and json.loads(raw)["overall"]["id_context_recall"] is None
    assert len((run / "records.jsonl").read_text().splitlines()) == 2
    md = (run / "report.md").read_text()
    assert "all-MiniLM-L6-v2 (bundled)" in md and "Decision Guidance" in md and "| logical_quality | 3.000 |" in md
    assert (
        "| s1 | c1 | ValidationError: facts / missing |" in md
        and "| s2 | (whole session) | RuntimeError: store gone |" in md
    )
    html = (run / "report.html").read_text()
    assert "<table>" in html and 'id="recall_by_group"' in html and 'id="judge_radar"' in html
    assert 'src="data:image/png;base64,' in html and "http" not in html.split("<body>")[1]
    assert read_summary(run)["n_queries"] == 2
    headers, rows = compare_runs([run]).headline_rows()
    assert rows[0][headers.index("fact_recall@10")] == "0.750"
    with pytest.raises(ValueError, match="protocol"):
        summarize("nope", records)
