"""Agents and pure helpers of the RealMem-style ``simulate`` generator.

Planning (outline, events, summaries), the scheduler (interleaving projects,
cool-down between projects of one topic, dates 1–3 days apart), the user
agent behind a time firewall, the assistant answering from a memory
framework, the goal evaluator and the memory manager (extract, deduplicate).
Every structured call goes through :func:`dualmem.models.structured.invoke_structured`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from dualmem.context import Context
from dualmem.frameworks.base import FrameworkContext, MemoryFramework, RetrievedItem
from dualmem.generators.checks import fragment_overlap, mentions_future
from dualmem.generators.toolkit import ask, options_of
from dualmem.prompts import simulate as P
from dualmem.schema import Persona

# --------------------------------------------------------------------------- LLM output schemas


class Project(BaseModel):
    """One long-running project of the user."""

    topic: str
    title: str
    goal: str = ""


class ProjectOutline(BaseModel):
    """The user's projects."""

    projects: list[Project]


class PlannedEvent(BaseModel):
    """One life event, the seed of one session."""

    project: str = Field(description="the project title")
    title: str
    detail: str = ""


class EventPlan(BaseModel):
    """Ordered events."""

    events: list[PlannedEvent]


class SessionPlan(BaseModel):
    """What one session is about and when it ends."""

    summary: str
    goal: str


class SessionPlans(BaseModel):
    """One plan per scheduled session."""

    sessions: list[SessionPlan]


class UserTurn(BaseModel):
    """The user agent's next message."""

    message: str


class AssistantTurn(BaseModel):
    """The assistant's reply and the memory items it used (their numbers)."""

    reply: str
    used_memory: list[int] = Field(default_factory=list)


class GoalCheck(BaseModel):
    """The goal evaluator's verdict."""

    goal_met: bool
    reason: str = ""


class ExtractedPoint(BaseModel):
    """One memory point of a session."""

    type: Literal["static", "dynamic", "schedule"]
    content: str
    source_turn: int | None = None


class ExtractedMemory(BaseModel):
    """The memory manager's answer."""

    points: list[ExtractedPoint] = Field(default_factory=list)


# --------------------------------------------------------------------------- options and resources


@dataclass(frozen=True)
class SimulateOptions:
    """Simulator options; stored in the graph input."""

    sessions: int = 10
    projects: int = 3
    max_turns: int = 6
    framework: str = "raw-turns"
    k: int = 5
    seed: int = 0
    start_date: str = "2024-03-01"
    cooldown: int = 2
    parallel_projects: int = 2
    dedup_overlap: float = 0.8

    @classmethod
    def of(cls, value: SimulateOptions | dict[str, Any] | None) -> SimulateOptions:
        """Return options from an object, a dict or None."""
        return options_of(cls, value, "simulate")

    def as_dict(self) -> dict[str, Any]:
        """Return the options as a JSON-friendly dict."""
        return asdict(self)


def open_memory(ctx: Context, name: str, persona: Persona, store_uri: str | None = None) -> MemoryFramework:
    """Return the context's memory framework object, or open framework ``name`` once per context.

    The assistant's memory lives in namespace ``(persona id, user_id)`` at ``store_uri``
    (the run's store), else at the ``store_uri`` setting.
    """
    if ctx.memory is not None:
        return ctx.memory
    key = f"memory:{name}"
    built: dict[str, Any] = ctx._built  # type: ignore[attr-defined]  # built once per context
    if key not in built:
        from dualmem.frameworks import open_framework

        context = FrameworkContext(
            namespace=(persona.id, ctx.settings.user),
            settings=ctx.settings,
            persona=persona,
            chat_model=ctx.llm("chat"),
            writer_model=ctx.llm("writer"),
            embeddings=ctx.load_embedder(),
            store_uri=store_uri,
        )
        built[key] = open_framework(name, context)
    return built[key]


# --------------------------------------------------------------------------- scheduling (pure)


def schedule(
    projects: Sequence[dict[str, Any]],
    events: Sequence[dict[str, Any]],
    n_sessions: int,
    *,
    cooldown: int = 2,
    parallel: int = 2,
    seed: int = 0,
    start_date: str = "2024-03-01",
) -> list[dict[str, Any]]:
    """Order events into sessions: projects interleave, a topic rests ``cooldown`` sessions between projects; dates +1–3 days."""
    by_project: dict[str, list[dict[str, Any]]] = {p["title"]: [] for p in projects}
    topic_of = {p["title"]: p["topic"] for p in projects}
    for e in events:
        title = e["project"] if e["project"] in by_project else next(iter(by_project), e["project"])
        by_project.setdefault(title, []).append(e)
        topic_of.setdefault(title, "general")
    pending = [t for t in by_project if by_project[t]]
    active: list[str] = []
    ended_at: dict[str, int] = {}
    rng = random.Random(f"schedule:{seed}")
    clock = datetime.fromisoformat(start_date).replace(hour=9)
    order: list[dict[str, Any]] = []
    step = 0
    while len(order) < n_sessions and (pending or active):
        for title in list(pending):
            topic = topic_of[title]
            resting = topic in ended_at and step - ended_at[topic] <= cooldown
            if len(active) < parallel and not resting and all(topic_of[a] != topic for a in active):
                active.append(title)
                pending.remove(title)
        if not active:  # everything left is resting: start the first anyway
            active.append(pending.pop(0))
        title = active[step % len(active)]
        event = by_project[title].pop(0)
        clock += timedelta(days=rng.randint(1, 3))
        order.append(
            {
                **event,
                "project": title,
                "topic": topic_of[title],
                "index": len(order),
                "date": clock.strftime("%Y-%m-%d") + f" {rng.randint(8, 21):02d}:{rng.choice((0, 15, 30, 45)):02d}",
            }
        )
        if not by_project[title]:
            active.remove(title)
            ended_at[topic_of[title]] = step
        step += 1
    return order


def event_text(event: dict[str, Any]) -> str:
    """Render one scheduled event as one line."""
    return f"{event['title']}: {event.get('detail', '')}".strip(": ")


# --------------------------------------------------------------------------- agents


def render_dialogue(turns: Sequence[dict[str, Any]]) -> str:
    """Render turns as ``index: speaker: text`` lines."""
    return (
        "\n".join(f"{i}: {'User' if t['role'] == 'user' else 'Assistant'}: {t['text']}" for i, t in enumerate(turns))
        or "(nothing yet)"
    )


def user_message(
    ctx: Context,
    persona: Persona,
    events: Sequence[dict[str, Any]],
    plans: Sequence[dict[str, Any]],
    index: int,
    turns: Sequence[dict[str, Any]],
) -> tuple[str | None, str]:
    """Write the user's next message seeing only sessions ``<= index`` (time firewall); return (message, error)."""
    past = (
        "\n".join(f"- {e['date']}: {event_text(e)} ({plans[e['index']]['summary']})" for e in events[:index])
        or "(this is the first conversation)"
    )
    current = events[index]
    system = SystemMessage(
        content=P.USER_AGENT_SYSTEM.format(
            name=persona.name,
            persona=persona.render(),
            past=past,
            date=current["date"],
            current=f"{event_text(current)}\n{plans[index]['summary']}",
            goal=plans[index]["goal"],
        )
    )
    later = [event_text(e) for e in events[index + 1 :]] + [p["summary"] for p in plans[index + 1 :]]
    known = (
        [event_text(e) for e in events[: index + 1]] + [p["summary"] for p in plans[: index + 1]] + [persona.render()]
    )
    feedback, leak = "", None
    for _ in range(ctx.settings.tuning.max_retries + 1):
        out = ask(
            ctx,
            [
                system,
                HumanMessage(content=P.USER_AGENT_TURN.format(dialogue=render_dialogue(turns), feedback=feedback)),
            ],
            UserTurn,
        )
        if out.value is None:
            return None, f"user agent: model output invalid after {out.attempts} attempt(s): {out.error}"
        leak = mentions_future(out.value.message, later, known)
        if leak is None:
            return out.value.message, ""
        feedback = P.FIREWALL_FEEDBACK.format(event=leak)
    return None, f"time firewall: the user agent kept mentioning a later event ({leak})"


def assistant_reply(
    ctx: Context, persona: Persona, memory: MemoryFramework, date: str, turns: Sequence[dict[str, Any]], k: int
) -> tuple[str | None, list[RetrievedItem], list[RetrievedItem], str]:
    """Retrieve memory for the last user message and answer; return (reply, retrieved, used, error)."""
    query = turns[-1]["text"]
    retrieved = memory.retrieve(query, k)
    listing = (
        "\n".join(f"[{i + 1}] ({it.source_session or '?'}) {it.text}" for i, it in enumerate(retrieved))
        or "(no memory yet)"
    )
    system = SystemMessage(content=P.ASSISTANT_SYSTEM.format(name=persona.name, date=date, memory=listing))
    history = [HumanMessage(content=render_dialogue(turns))]
    out = ask(ctx, [system, *history], AssistantTurn)
    if out.value is None:
        return None, retrieved, [], f"assistant: model output invalid after {out.attempts} attempt(s): {out.error}"
    used = [retrieved[i - 1] for i in dict.fromkeys(out.value.used_memory) if 1 <= i <= len(retrieved)]
    return out.value.reply, retrieved, used, ""


def goal_met(ctx: Context, goal: str, turns: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """Ask the evaluator whether the session goal is met; an invalid answer counts as not met (with its reason)."""
    out = ask(
        ctx,
        [HumanMessage(content=P.GOAL_USER.format(goal=goal, dialogue=render_dialogue(turns)))],
        GoalCheck,
        judge=True,
    )
    if out.value is None:
        return False, f"evaluator: model output invalid after {out.attempts} attempt(s): {out.error}"
    return out.value.goal_met, out.value.reason


def dedupe(
    points: Sequence[dict[str, Any]], known: Sequence[str], threshold: float = 0.8
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split points into (new, duplicates): a duplicate shares ``threshold`` of its units with a known text or an earlier point."""
    kept: list[dict[str, Any]] = []
    dupes: list[dict[str, Any]] = []
    seen = list(known)
    for p in points:
        twin = next(
            (
                s
                for s in seen
                if fragment_overlap(p["content"], s) >= threshold
                and fragment_overlap(s, p["content"]) >= threshold * 0.75
            ),
            None,
        )
        if twin is not None:
            dupes.append({**p, "duplicate_of": twin})
            continue
        kept.append(p)
        seen.append(p["content"])
    return kept, dupes


def extract_memory(
    ctx: Context, persona: Persona, turns: Sequence[dict[str, Any]], known: Sequence[str]
) -> tuple[list[dict[str, Any]], str]:
    """Extract the session's memory points (static, dynamic, schedule) with their source turn."""
    prompt = P.MEMORY_USER.format(
        name=persona.name, known="\n".join(f"- {k}" for k in known) or "(nothing)", dialogue=render_dialogue(turns)
    )
    out = ask(ctx, [HumanMessage(content=prompt)], ExtractedMemory)
    if out.value is None:
        return [], f"memory manager: model output invalid after {out.attempts} attempt(s): {out.error}"
    points = []
    for p in out.value.points:
        src = p.source_turn if p.source_turn is not None and 0 <= p.source_turn < len(turns) else None
        points.append({"type": p.type, "content": p.content, "source_turn": src})
    return points, ""
