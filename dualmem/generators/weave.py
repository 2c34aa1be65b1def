"""Model steps of the RoleMemo ``weave`` generator: ideate, check, write fragments, weave.

Every structured call goes through :func:`dualmem.models.structured.invoke_structured`;
an answer still malformed after the repairs becomes a rejection with its
reason (stage, error, attempts), never a silent drop. :func:`build_query`
runs one insight through all per-insight steps and returns one result row.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from dualmem.context import Context
from dualmem.errors import ModelCallError
from dualmem.generators.checks import difficulty_check, flag_turns, fragment_overlap
from dualmem.generators.toolkit import ask, options_of
from dualmem.models.retry import invoke_with_retry
from dualmem.models.structured import Structured
from dualmem.prompts import weave as P
from dualmem.schema import TASK_TYPES, Persona, stable_id

# --------------------------------------------------------------------------- LLM output schemas


class InsightDraft(BaseModel):
    """One candidate insight."""

    text: str = Field(description="the persona's interpretation, one or two sentences")
    # minimum lengths are part of the schema, so constrained decoding (the bundled model) must produce them
    reasoning_steps: list[str] = Field(min_length=2, description="at least two reasoning steps")
    fact_kinds: list[str] = Field(min_length=2, description="at least two kinds of fact it combines")


class InsightBatch(BaseModel):
    """Candidate insights of one task type."""

    insights: list[InsightDraft] = Field(min_length=1)


class SpecificityVerdict(BaseModel):
    """The four yes/no specificity checks."""

    perspective_unique: bool
    conversational: bool
    needs_fact_combination: bool
    testable: bool
    reason: str = ""


class QuerySeed(BaseModel):
    """Two fact fragments, a test question and the reasoning connector."""

    fragment_1: str = Field(min_length=1)
    fragment_2: str = Field(min_length=1)
    question: str = Field(min_length=1)
    connector: str = ""


class NecessityVerdict(BaseModel):
    """Whether answering well needs memory."""

    needs_memory: bool
    reason: str = ""


class WovenTurn(BaseModel):
    """One message of a woven dialogue."""

    role: str = Field(description="user or assistant")
    text: str = Field(min_length=1)


class WovenDialogue(BaseModel):
    """A casual dialogue carrying two fragments in passing."""

    topic: str = ""
    turns: list[WovenTurn] = Field(min_length=2)


class SafetyVerdict(BaseModel):
    """The LLM review of pattern-flagged lines."""

    safe: bool
    reason: str = ""


SPECIFICITY_CHECKS = ("perspective_unique", "conversational", "needs_fact_combination", "testable")

# --------------------------------------------------------------------------- resources and options


@dataclass(frozen=True)
class WeaveOptions:
    """Generator options (sizes, thresholds, placement); stored in the graph input."""

    n_per_type: int = 5
    rounds: int = 24
    segment_rounds: int = 6
    min_rounds: int = 4
    weave_attempts: int = 2
    overlap_threshold: float = 0.6
    similarity_threshold: float = 0.6
    max_concept_overlap: float = 0.4
    lengths: tuple[int, ...] = (32000, 64000, 128000, 256000)
    seed: int = 0
    depths: tuple[str, ...] = ("beginning", "middle", "end")
    fragment_distance: int = 2
    tolerance: float = 0.05

    @classmethod
    def of(cls, value: WeaveOptions | dict[str, Any] | None) -> WeaveOptions:
        """Return options from an object, a (JSON) dict or None."""
        return options_of(cls, value, "weave")

    def as_dict(self) -> dict[str, Any]:
        """Return the options as a JSON-friendly dict."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _failed(stage: str, out: Structured[Any]) -> str:
    if out.call_failed:
        return f"{stage}: {out.error}"
    return f"{stage}: model output invalid after {out.attempts} attempt(s): {out.error}"


def user_profile(persona: Persona) -> str:
    """Render the persona's user profile (or a neutral default)."""
    profile = persona.user_profile
    if isinstance(profile, dict):
        return json.dumps(profile, ensure_ascii=False)
    return profile or "An ordinary adult who chats with the persona now and then."


# --------------------------------------------------------------------------- per persona


def ideate(ctx: Context, persona: Persona, opts: WeaveOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate ``n_per_type`` insights per task type; return (insights, rejections)."""
    system = SystemMessage(content=P.IDEATE_SYSTEM.format(persona=persona.render(), user_profile=user_profile(persona)))
    insights, rejections = [], []
    for task_type in TASK_TYPES:
        prompt = P.IDEATE_USER.format(n=opts.n_per_type, task_type=task_type, guide=P.TASK_GUIDE[task_type])
        out = ask(ctx, [system, HumanMessage(content=prompt)], InsightBatch)
        base = {"persona_id": persona.id, "task_type": task_type, "stage": "ideation"}
        if out.value is None:
            rejections.append({**base, "insight_id": None, "reason": _failed("ideation", out)})
            continue
        good = 0
        for n, draft in enumerate(out.value.insights):
            iid = stable_id(persona.id, task_type, n, draft.text, prefix="ins-")
            if good >= opts.n_per_type:
                break
            if len(draft.reasoning_steps) < 2 or len({k.strip().lower() for k in draft.fact_kinds}) < 2:
                reason = f"needs >= 2 reasoning steps and >= 2 fact kinds, got {len(draft.reasoning_steps)} and {len(draft.fact_kinds)}"
                rejections.append({**base, "insight_id": iid, "text": draft.text, "reason": reason})
                continue
            good += 1
            insights.append({"id": iid, "persona_id": persona.id, "task_type": task_type, **draft.model_dump()})
        if good < opts.n_per_type:
            rejections.append(
                {**base, "insight_id": None, "reason": f"shortfall: {good} of {opts.n_per_type} usable insights"}
            )
    return insights, rejections


# --------------------------------------------------------------------------- per insight


def check_specificity(ctx: Context, persona: Persona, insight: dict[str, Any]) -> tuple[bool, str]:
    """Run the four yes/no specificity checks; return (passed, reason)."""
    prompt = P.SPECIFICITY_USER.format(
        persona=persona.render(),
        task_type=insight["task_type"],
        insight=insight["text"],
        steps=" -> ".join(insight["reasoning_steps"]),
        kinds=", ".join(insight["fact_kinds"]),
    )
    out = ask(ctx, [HumanMessage(content=prompt)], SpecificityVerdict, judge=True)
    if out.value is None:
        return False, _failed("specificity", out)
    failed = [c for c in SPECIFICITY_CHECKS if not getattr(out.value, c)]
    return (not failed), (f"failed {', '.join(failed)}: {out.value.reason}" if failed else "")


def write_seed(
    ctx: Context, persona: Persona, insight: dict[str, Any], max_concept_overlap: float = 0.4
) -> tuple[QuerySeed | None, str]:
    """Write the two fragments, the test question and the connector of one insight.

    A question sharing ``max_concept_overlap`` or more of the insight's content words is rejected.
    """
    prompt = P.FRAGMENTS_USER.format(
        persona=persona.render(),
        user_profile=user_profile(persona),
        task_type=insight["task_type"],
        insight=insight["text"],
        steps=" -> ".join(insight["reasoning_steps"]),
    )
    out = ask(ctx, [HumanMessage(content=prompt)], QuerySeed)
    if out.value is None:
        return None, _failed("fragments", out)
    seed = out.value
    if not (seed.fragment_1.strip() and seed.fragment_2.strip() and seed.question.strip()):
        return None, "fragments: empty fragment or question"
    leaked = fragment_overlap(insight["text"], seed.question)
    if leaked >= max_concept_overlap:
        return None, f"question uses the insight's core concepts: {leaked:.0%} of its words"
    return seed, ""


def check_necessity(ctx: Context, persona: Persona, insight: dict[str, Any], seed: QuerySeed) -> tuple[bool, str, str]:
    """Answer without history, then judge whether the gold insight needed memory; return (kept, reason, answer)."""
    system = SystemMessage(content=P.ANSWER_SYSTEM.format(name=persona.name, persona=persona.render()))
    try:
        reply = invoke_with_retry(ctx.llm("chat"), [system, HumanMessage(content=seed.question)], policy=ctx.settings)
    except ModelCallError as exc:  # recorded as this insight's rejection reason; the run goes on
        return False, f"necessity: answer without history: {exc}", ""
    answer = reply.content if isinstance(reply.content, str) else json.dumps(reply.content)
    prompt = P.NECESSITY_USER.format(question=seed.question, answer=answer, insight=insight["text"])
    out = ask(ctx, [HumanMessage(content=prompt)], NecessityVerdict, judge=True)
    if out.value is None:
        return False, _failed("necessity", out), answer
    if not out.value.needs_memory:
        return False, f"answerable without memory: {out.value.reason}", answer
    return True, "", answer


def _role(raw: str, persona: Persona) -> str:
    return "assistant" if raw.strip().lower() in {"assistant", "agent", "ai", persona.name.lower()} else "user"


def weave_parts(rounds: int, segment_rounds: int) -> list[int]:
    """Return the rounds of each part a dialogue is written in (one part when ``segment_rounds`` is 0)."""
    if segment_rounds <= 0 or rounds <= segment_rounds:
        return [rounds]
    n = -(-rounds // segment_rounds)
    return [rounds // n + (1 if i < rounds % n else 0) for i in range(n)]


def _write_dialogue(
    ctx: Context, persona: Persona, seed: QuerySeed, topic: str, opts: WeaveOptions, feedback: str
) -> tuple[list[dict[str, Any]] | None, str]:
    """Write the dialogue part by part: fragment 1 in the first part, fragment 2 in the last."""
    parts = weave_parts(opts.rounds, opts.segment_rounds)
    facts: list[list[str]] = [[] for _ in parts]
    facts[0].append(seed.fragment_1)
    facts[-1].append(seed.fragment_2)
    turns: list[dict[str, Any]] = []
    for n, rounds in enumerate(parts):
        tail = "\n".join(f"{'User' if t['role'] == 'user' else persona.name}: {t['text']}" for t in turns[-4:])
        fact_text = "\n".join(P.WEAVE_FACT.format(fragment=f, name=persona.name) for f in facts[n]) or P.WEAVE_NO_FACT
        prompt = P.WEAVE_USER.format(
            part=n + 1,
            parts=len(parts),
            name=persona.name,
            persona=persona.render(),
            user_profile=user_profile(persona),
            topic=topic,
            so_far=P.WEAVE_SO_FAR.format(tail=tail) if turns else P.WEAVE_START,
            rounds=rounds,
            facts=fact_text,
            feedback=P.WEAVE_FEEDBACK.format(reason=feedback) if feedback else "",
        )
        out = ask(ctx, [HumanMessage(content=prompt)], WovenDialogue)
        if out.value is None:
            return None, _failed("weave", out) + f" (part {n + 1} of {len(parts)})"
        turns.extend({"role": _role(t.role, persona), "text": t.text} for t in out.value.turns if t.text.strip())
    return turns, ""


def weave(ctx: Context, persona: Persona, seed: QuerySeed, topic: str, opts: WeaveOptions) -> dict[str, Any]:
    """Weave the fragments into a dialogue and run the difficulty check, re-weaving with feedback once it fails."""
    reason, stage = "", "weave"
    for attempt in range(max(1, opts.weave_attempts)):
        turns, error = _write_dialogue(ctx, persona, seed, topic, opts, reason)
        if turns is None:
            return {"ok": False, "stage": "weave", "reason": error, "attempts": attempt + 1}
        users = sum(1 for t in turns if t["role"] == "user")
        if users < opts.min_rounds:
            reason, stage = f"only {users} rounds, expected about {opts.rounds}", "weave"
            continue
        check = difficulty_check(
            turns,
            [seed.fragment_1, seed.fragment_2],
            embeddings=ctx.load_embedder(),
            overlap_threshold=opts.overlap_threshold,
            similarity_threshold=opts.similarity_threshold,
        )
        if check.ok:
            return {
                "ok": True,
                "turns": turns,
                "topic": topic,
                "fragment_turns": check.fragment_turns,
                "attempts": attempt + 1,
                "rounds": users,
            }
        reason, stage = "; ".join(check.reasons), "difficulty"
    return {"ok": False, "stage": stage, "reason": reason, "attempts": opts.weave_attempts}


def check_safety(ctx: Context, turns: list[dict[str, Any]]) -> tuple[bool, str, list[dict[str, Any]]]:
    """Pattern pass over the turns, then an LLM review of what it flags; return (safe, reason, flags)."""
    flagged = flag_turns(turns)
    if not flagged:
        return True, "", []
    kinds = sorted({f["kind"] for row in flagged for f in row["flags"]})
    lines = "\n".join(f"[{row['turn']}] {row['role']}: {row['text']}" for row in flagged)
    out = ask(
        ctx,
        [HumanMessage(content=P.SAFETY_USER.format(kinds=", ".join(kinds), lines=lines))],
        SafetyVerdict,
        judge=True,
    )
    if out.value is None:
        return False, _failed("safety", out), flagged
    return out.value.safe, ("" if out.value.safe else f"unsafe ({', '.join(kinds)}): {out.value.reason}"), flagged


def build_query(
    ctx: Context, persona: Persona, insight: dict[str, Any], topic: str, opts: WeaveOptions
) -> dict[str, Any]:
    """Run one insight through specificity, fragments, necessity, weaving, difficulty and safety; return its row."""
    row: dict[str, Any] = {
        "insight_id": insight["id"],
        "persona_id": persona.id,
        "task_type": insight["task_type"],
        "checks": {},
    }

    def reject(stage: str, reason: str) -> dict[str, Any]:
        row["checks"][stage] = False
        return {**row, "status": "rejected", "stage": stage, "reason": reason}

    ok, reason = check_specificity(ctx, persona, insight)
    if not ok:
        return reject("specificity", reason)
    row["checks"]["specificity"] = True
    seed, reason = write_seed(ctx, persona, insight, opts.max_concept_overlap)
    if seed is None:
        return reject("fragments", reason)
    row["checks"]["fragments"] = True
    ok, reason, answer = check_necessity(ctx, persona, insight, seed)
    row["no_memory_answer"] = answer
    if not ok:
        return reject("necessity", reason)
    row["checks"]["necessity"] = True
    woven = weave(ctx, persona, seed, topic, opts)
    row["weave_attempts"] = woven["attempts"]
    if not woven["ok"]:
        if woven["stage"] == "difficulty":
            row["checks"]["weave"] = True
        return reject(woven["stage"], woven["reason"])
    row["checks"]["weave"] = True
    row["checks"]["difficulty"] = True
    safe, reason, flags = check_safety(ctx, [*woven["turns"], {"role": "user", "text": seed.question}])
    row["safety_flags"] = flags
    if not safe:
        return reject("safety", reason)
    row["checks"]["safety"] = True
    item = {
        "query_id": stable_id(persona.id, insight["id"], prefix="q-"),
        "insight_id": insight["id"],
        "question": seed.question,
        "task_type": insight["task_type"],
        "fragments": [seed.fragment_1, seed.fragment_2],
        "insight": insight["text"],
        "connector": seed.connector,
        "turns": woven["turns"],
        "fragment_turns": woven["fragment_turns"],
        "topic": woven["topic"],
    }
    return {**row, "status": "kept", "stage": "done", "reason": "", "item": item}


STAGES = ("specificity", "fragments", "necessity", "weave", "difficulty", "safety")
