"""The nodes, states and routes of the ``weave`` graph (:mod:`dualmem.graphs.weave` wires them)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Send
from typing_extensions import TypedDict

from dualmem.context import context_of
from dualmem.datasets.rolememo import rolememo_json
from dualmem.generators.assemble import assemble_history
from dualmem.generators.weave import STAGES, WeaveOptions, build_query, ideate
from dualmem.prompts.weave import WEAVE_TOPICS
from dualmem.schema import Persona


def merge_by(
    key: Callable[[dict[str, Any]], Any],
) -> Callable[[list[dict[str, Any]] | None, list[dict[str, Any]] | None], list[dict[str, Any]]]:
    """Return a reducer merging dict rows by ``key`` (a newer row replaces an older one)."""

    def reduce(left: list[dict[str, Any]] | None, right: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        rows = {key(r): r for r in left or []}
        rows.update({key(r): r for r in right or []})
        return list(rows.values())

    return reduce


def _rejection_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row.get("persona_id"), row.get("task_type"), row.get("insight_id"), row.get("reason"))


class WeaveState(TypedDict, total=False):
    """State of the weave graph."""

    personas: list[dict[str, Any]]
    options: dict[str, Any]
    ideated: Annotated[list[dict[str, Any]], merge_by(lambda r: r["persona_id"])]
    insights: Annotated[list[dict[str, Any]], merge_by(lambda r: r["id"])]
    rejections: Annotated[list[dict[str, Any]], merge_by(_rejection_key)]
    results: Annotated[list[dict[str, Any]], merge_by(lambda r: r["insight_id"])]
    items: list[dict[str, Any]]
    manifest: dict[str, Any]


class PersonaTask(TypedDict):
    """Input of one ``ideate`` branch."""

    persona: dict[str, Any]
    options: dict[str, Any]


class InsightTask(TypedDict):
    """Input of one ``make_query`` branch."""

    persona: dict[str, Any]
    insight: dict[str, Any]
    topic: str
    options: dict[str, Any]


def _persona(data: dict[str, Any]) -> Persona:
    return Persona.model_validate(data)


def fan_personas(state: WeaveState) -> list[Send] | Literal["plan"]:
    """Send every persona not yet ideated to ``ideate``."""
    done = {r["persona_id"] for r in state.get("ideated") or []}
    sends = [
        Send("ideate", PersonaTask(persona=p, options=state.get("options") or {}))
        for p in state.get("personas") or []
        if _persona(p).id not in done
    ]
    return sends or "plan"


def ideate_persona(state: PersonaTask, runtime: Runtime[Any]) -> dict[str, Any]:
    """Generate one persona's insights (per task type), recording rejections."""
    persona = _persona(state["persona"])
    insights, rejections = ideate(context_of(runtime), persona, WeaveOptions.of(state["options"]))
    return {
        "insights": insights,
        "rejections": rejections,
        "ideated": [{"persona_id": persona.id, "insights": len(insights)}],
    }


def plan(state: WeaveState) -> dict[str, Any]:
    """Join the persona branches (the insight fan-out follows)."""
    return {"ideated": []}


def _topic(insight_id: str, seed: int) -> str:
    return (
        WEAVE_TOPICS[(int(insight_id[-8:], 16) + seed) % len(WEAVE_TOPICS)]
        if insight_id[-8:].isalnum()
        else WEAVE_TOPICS[0]
    )


def fan_insights(state: WeaveState) -> list[Send] | Literal["assemble"]:
    """Send every insight without a result to ``make_query``."""
    done = {r["insight_id"] for r in state.get("results") or []}
    personas = {_persona(p).id: p for p in state.get("personas") or []}
    seed = WeaveOptions.of(state.get("options")).seed
    sends = [
        Send(
            "make_query",
            InsightTask(
                persona=personas[i["persona_id"]],
                insight=i,
                topic=_topic(i["id"], seed),
                options=state.get("options") or {},
            ),
        )
        for i in state.get("insights") or []
        if i["id"] not in done
    ]
    return sends or "assemble"


def make_query(state: InsightTask, runtime: Runtime[Any]) -> dict[str, Any]:
    """Turn one insight into a checked, woven query (or a recorded rejection)."""
    opts = WeaveOptions.of(state["options"])
    row = build_query(context_of(runtime), _persona(state["persona"]), state["insight"], state["topic"], opts)
    return {"results": [row]}


def reason_key(reason: str) -> str:
    """Return the kind of a rejection reason, for grouping: its first clause without stage prefix, quoted text or numbers.

    ``difficulty: fragment 1 ('I painted…') occurs in 2 user turns [3, 7], expected exactly one`` and the same
    failure of another fragment both give ``fragment N occurs in N user turns, expected exactly one``.
    """
    head, _, rest = reason.partition(": ")
    if head in {*STAGES, "ideation"} and rest:
        reason = rest
    reason = reason.split("; ")[0]
    reason = re.sub(r"\s*\((?:'[^']*'|\"[^\"]*\")\)", "", reason)  # a fragment's text
    reason = re.sub(r"\s*\[[^\]]*\]", "", reason)  # turn lists
    reason = re.sub(r"\s+\([^)]*\)$", "", reason.split(": ")[0].split(", got ")[0])
    return re.sub(r"\d+(?:\.\d+)?%?", "N", reason).strip()[:80]


def _is_shortfall(row: dict[str, Any]) -> bool:
    return str(row.get("reason", "")).startswith("shortfall")


def _check_stats(state: WeaveState, opts: WeaveOptions) -> dict[str, Any]:
    """Return per check: total, passed, pass rate and rejections grouped by kind (``total - passed`` = their sum)."""
    results = state.get("results") or []
    rejected = [r for r in state.get("rejections") or [] if not _is_shortfall(r)]  # drafts (or whole answers) refused
    asked = opts.n_per_type * 4 * len(state.get("personas") or [])
    made = len(state.get("insights") or [])
    total = made + len(rejected)
    checks: dict[str, Any] = {
        "ideation": {
            "total": total,
            "passed": made,
            "pass_rate": round(made / total, 4) if total else 0.0,
            "rejections": dict(Counter(reason_key(r["reason"]) for r in rejected)),
            "asked": asked,
            "shortfall": max(0, asked - made),
        }
    }
    for stage in STAGES:
        reached = [r for r in results if stage in r["checks"]]
        passed = sum(1 for r in reached if r["checks"][stage])
        reasons = Counter(reason_key(r["reason"]) for r in reached if not r["checks"][stage])
        checks[stage] = {
            "total": len(reached),
            "passed": passed,
            "pass_rate": round(passed / len(reached), 4) if reached else 0.0,
            "rejections": dict(reasons),
        }
    return checks


def assemble(state: WeaveState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Build every persona's histories of every target length; write the manifest."""
    opts = WeaveOptions.of(state.get("options"))
    user = context_of(runtime).settings.user
    kept = [r for r in state.get("results") or [] if r["status"] == "kept"]
    items, histories, skipped = [], [], []
    for data in state.get("personas") or []:
        persona = _persona(data)
        woven = sorted((r["item"] for r in kept if r["persona_id"] == persona.id), key=lambda w: w["query_id"])
        if not woven:
            skipped.append(persona.id)
            continue
        for length in opts.lengths:
            item, stats = assemble_history(
                persona,
                woven,
                length,
                seed=opts.seed,
                depths=opts.depths,
                fragment_distance=opts.fragment_distance,
                tolerance=opts.tolerance,
                user_id=user,
            )
            item.dialogue.meta["generator"] = {"graph": "weave", "options": opts.as_dict()}
            items.append(rolememo_json(item))
            histories.append({"id": item.dialogue.id, "persona_id": persona.id, **stats})
    rejected = [
        {k: r.get(k) for k in ("persona_id", "insight_id", "task_type", "stage", "reason")}
        for r in [
            *(state.get("rejections") or []),
            *(r for r in state.get("results") or [] if r["status"] == "rejected"),
        ]
    ]
    manifest = {
        "format": "rolememo/1",
        "generator": "dualmem weave",
        "personas": len(state.get("personas") or []),
        "insights": len(state.get("insights") or []),
        "queries_kept": len(kept),
        "queries_by_type": dict(Counter(r["task_type"] for r in kept)),
        "checks": _check_stats(state, opts),
        "rejections": rejected,
        "histories": histories,
        "skipped_personas": skipped,
        "options": opts.as_dict(),
    }
    return {"items": items, "manifest": manifest}
