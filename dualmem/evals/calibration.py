"""Judge calibration: how often the configured judge accepts a wrong answer, and rejects a right one.

:func:`calibrate` runs the judges of a protocol's answers — RoleMemo's four role-play dimensions, RealMem's answer
judge, LoCoMo's correctness judge — on the faithful and wrong-but-on-topic answers :mod:`dualmem.evals.perturb`
builds from the dataset's gold answers (the first ``calibration_queries`` of each persona), and reports, per judge,
the false-accept rate (wrong answers accepted) and the false-reject rate (faithful answers rejected) with their
counts. An answer judge accepts at a fixed score (LoCoMo: 1 of 1; RealMem: 2 of 3, "uses the memory"); a role-play
dimension scores quality, not truth, so there a wrong answer counts accepted when it scores at least what the gold
answer scored, and a faithful answer counts rejected below 2.5 of 5. A judge whose false-accept rate exceeds
``judge_leniency_max`` is named in ``lenient``, and reports warn beside its scores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dualmem.config import Settings
from dualmem.evals.cost import Meter, carry, total
from dualmem.evals.journal import StepLog
from dualmem.evals.judges import (
    ROLEPLAY_KEYS,
    Evaluator,
    apply_judges,
    locomo_correctness_judge,
    realmem_answer_judge,
    roleplay_judges,
)
from dualmem.evals.langsmith_adapter import example_fields
from dualmem.evals.perturb import FAITHFUL, WRONG, candidates
from dualmem.evals.record import UnitSteps
from dualmem.evals.runners import persona_text
from dualmem.models import model_name
from dualmem.schema import DatasetItem

ACCEPT_AT = {"locomo_correctness": 0.5, "realmem_answer": 2.0}  # an answer judge accepts at or above this score
FAITHFUL_AT = 2.5  # a role-play dimension (0-5) scoring a faithful answer below this rejects it
EXAMPLES = 10  # false accepts kept in the result to show


def answer_judges(dataset_kind: str, model: Any, settings: Settings) -> list[Evaluator]:
    """Return the judges that score answers in a protocol (RealMem's memory judge scores retrieval, not answers)."""
    if dataset_kind == "rolememo":
        return roleplay_judges(model, settings=settings)
    if dataset_kind == "realmem":
        return [realmem_answer_judge(model, settings=settings)]
    if dataset_kind == "locomo":
        return [locomo_correctness_judge(model, settings=settings)]
    raise ValueError(f"unknown dataset kind {dataset_kind!r}; use rolememo, realmem or locomo")


def verdicts(
    items: Sequence[DatasetItem],
    judges: Sequence[Evaluator],
    *,
    limit: int | None = None,
    workers: int = 1,
    journal: StepLog | None = None,
) -> list[tuple[dict[str, Any], dict[str, float | None]]]:
    """Return every candidate with its judges' scores (None: the judge failed); a journal keeps each once."""
    texts = {it.dialogue.id: persona_text(it) for it in items}

    def judged(cand: dict[str, Any]) -> dict[str, float | None]:
        if journal is not None and (done := journal.get("calibration", cand["id"])) is not None:
            return dict(done)
        fields = example_fields(cand, texts[cand["persona"]])
        scores, _errors = apply_judges(
            judges, fields["inputs"], {"answer": cand["answer"], "retrieved": []}, fields["outputs"]
        )
        out = {key: res.get("score") for key, res in scores.items()}
        if journal is not None and not any((r.get("extra") or {}).get("call_failed") for r in scores.values()):
            journal.put("calibration", cand["id"], out)
        return out

    cands = [c for it in items for c in candidates(it, limit)]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(zip(cands, pool.map(carry(judged), cands), strict=True))


def _decide(key: str, score: float, gold: float | None, faithful: bool) -> bool | None:
    """Return whether a wrong answer was accepted / a faithful one rejected (None: no gold score to compare with)."""
    if key in ACCEPT_AT:
        return score < ACCEPT_AT[key] if faithful else score >= ACCEPT_AT[key]
    if faithful:
        return score < FAITHFUL_AT
    return None if gold is None else score >= gold


def rates(judged: Sequence[tuple[Mapping[str, Any], Mapping[str, float | None]]], threshold: float) -> dict[str, Any]:
    """Return per judge key the false-accept and false-reject rates with their counts, and the lenient keys."""
    gold = {
        (c["persona"], c["query_id"], k): s for c, scores in judged if c["kind"] == "gold" for k, s in scores.items()
    }
    out: dict[str, dict[str, Any]] = {}
    shown: list[dict[str, Any]] = []
    for cand, scores in judged:
        for key, score in scores.items():
            row = out.setdefault(
                key, {"false_accepts": 0, "wrong": 0, "false_rejects": 0, "faithful": 0, "errors": 0, "by_kind": {}}
            )
            if score is None:
                row["errors"] += 1
                continue
            bad = _decide(key, float(score), gold.get((cand["persona"], cand["query_id"], key)), cand["faithful"])
            if bad is None:
                continue
            side = "faithful" if cand["faithful"] else "wrong"
            row[side] += 1
            row["false_rejects" if cand["faithful"] else "false_accepts"] += int(bad)
            kind = row["by_kind"].setdefault(cand["kind"], {"n": 0, "rejected" if cand["faithful"] else "accepted": 0})
            kind["n"] += 1
            kind["rejected" if cand["faithful"] else "accepted"] += int(bad)
            if bad and not cand["faithful"] and len(shown) < EXAMPLES:
                shown.append(
                    {
                        "judge": key,
                        "persona": cand["persona"],
                        "query_id": cand["query_id"],
                        "kind": cand["kind"],
                        "answer": cand["answer"],
                        "score": score,
                    }
                )
    for row in out.values():
        row["false_accept"] = row["false_accepts"] / row["wrong"] if row["wrong"] else None
        row["false_reject"] = row["false_rejects"] / row["faithful"] if row["faithful"] else None
    lenient = [k for k, r in out.items() if r["false_accept"] is not None and r["false_accept"] > threshold]
    return {"judges": out, "lenient": lenient, "threshold": threshold, "false_accepts_shown": shown}


def calibrate(
    dataset_kind: str,
    items: Sequence[DatasetItem],
    judge: Any,
    settings: Settings,
    *,
    journal: StepLog | None = None,
    judges: Sequence[Evaluator] | None = None,
) -> dict[str, Any]:
    """Run the judge of ``dataset_kind`` (a model spec or object; or ``judges``) on the candidates of ``items``; return its
    leniency (:func:`rates`), the candidates' counts, the rules and what the judge's calls cost."""
    meter = Meter()
    if isinstance(journal, UnitSteps):  # each verdict recorded with what it cost: a resumed calibration counts it once
        journal.meter = meter
    with meter.counting("calibration"):
        judged = verdicts(
            items,
            judges or answer_judges(dataset_kind, judge, settings),
            limit=settings.evaluation.calibration_queries,
            workers=settings.evaluation.concurrency,
            journal=journal,
        )
    spent = meter.phases().get("calibration")
    if isinstance(journal, UnitSteps):
        journal.spend()
        spent = total({str(i): row["calibration"] for i, row in enumerate(journal.spent()) if "calibration" in row})
    kinds = {k: sum(1 for c, _ in judged if c["kind"] == k) for k in (*FAITHFUL, *WRONG)}
    return {
        "dataset": dataset_kind,
        "judge_model": judge if isinstance(judge, str) else model_name(judge),
        "queries": kinds["gold"],
        "candidates": kinds,
        **rates(judged, settings.evaluation.judge_leniency_max),
        "rules": {
            "answer judges": {k: f"accepts at score >= {v:g}" for k, v in ACCEPT_AT.items()},
            "role-play dimensions": f"a wrong answer is accepted when it scores at least the gold answer's score; "
            f"a faithful one is rejected below {FAITHFUL_AT:g}",
        },
        "cost": spent,
    }


def leniency(calibration: Mapping[str, Any] | None, key: str) -> tuple[str, str]:
    """Return the false-accept and false-reject cells of judge ``key`` (``rate (k/n)``; '–' when not calibrated)."""
    row = ((calibration or {}).get("judges") or {}).get(key)
    if not row:
        return "–", "–"
    cell = lambda rate, k, n: "–" if rate is None else f"{rate:.3f} ({k}/{n})"  # noqa: E731
    return cell(row["false_accept"], row["false_accepts"], row["wrong"]), cell(
        row["false_reject"], row["false_rejects"], row["faithful"]
    )


def warnings(calibration: Mapping[str, Any] | None) -> list[str]:
    """Return a warning line per judge more lenient than the threshold."""
    cal = calibration or {}
    return [
        f"WARNING: judge {k} accepted {cal['judges'][k]['false_accept']:.0%} of deliberately wrong answers "
        f"(judge_leniency_max = {cal['threshold']:g}): its scores overstate quality"
        for k in cal.get("lenient") or []
    ]


def render_markdown(calibration: Mapping[str, Any], table: Callable[..., str], *, warn: bool = True) -> list[str]:
    """Return the judge-calibration section lines (``table``: the report's markdown table maker; ``warn``: with the
    warnings, which a run's report shows beside its judge scores instead)."""
    c = calibration
    kinds = ", ".join(f"{k} {n}" for k, n in c["candidates"].items() if n)
    rules = [c["rules"]["role-play dimensions"]] if set(c["judges"]) & set(ROLEPLAY_KEYS) else []
    rules += [f"{k} {v}" for k, v in c["rules"]["answer judges"].items() if k in c["judges"]]
    rows = [
        [
            k,
            *leniency(c, k),
            int(r["errors"]),
            ", ".join(f"{kind} {v.get('accepted', v.get('rejected'))}/{v['n']}" for kind, v in r["by_kind"].items()),
        ]
        for k, r in c["judges"].items()
    ]
    return [
        "## Judge calibration",
        "",
        f"The judge ({c['judge_model']}) scored {sum(c['candidates'].values())} answers built from {c['queries']} gold "
        f"answers ({kinds}); {'; '.join(rules)}.",
        "",
        table(
            ["judge", "false-accept (wrong)", "false-reject (faithful)", "errors", "accepted / rejected by kind"], rows
        ),
        "",
        *(f"**{w}**" for w in warnings(c) if warn),
        "",
    ]
