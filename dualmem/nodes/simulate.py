"""The nodes, states and routes of the ``simulate`` graph (:mod:`dualmem.graphs.simulate` wires them)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from dualmem.context import Context, context_of
from dualmem.datasets.realmem import realmem_json
from dualmem.generators import simulate as A
from dualmem.nodes.weave import merge_by
from dualmem.prompts import simulate as P
from dualmem.schema import Dialogue, GoldEvidence, MemoryPoint, Persona, Query, Session, Turn, stable_id


class SimState(TypedDict, total=False):
    """State of the simulate graph."""

    persona: dict[str, Any]
    options: dict[str, Any]
    projects: list[dict[str, Any]]
    events: list[dict[str, Any]]
    plans: list[dict[str, Any]]
    cursor: int
    turns: list[dict[str, Any]]
    retrieved: list[str]
    goal_met: bool
    blocked: str
    known_points: list[str]
    sessions: Annotated[list[dict[str, Any]], merge_by(lambda r: r["id"])]
    queries: Annotated[list[dict[str, Any]], merge_by(lambda r: r["id"])]
    issues: Annotated[list[dict[str, Any]], merge_by(lambda r: (r["stage"], r.get("session"), r["reason"]))]
    realmem: dict[str, Any]


def _ctx(state: SimState, runtime: Runtime[Any]) -> tuple[Context, Persona, A.SimulateOptions]:
    return context_of(runtime), Persona.model_validate(state["persona"]), A.SimulateOptions.of(state.get("options"))


def _memory(ctx: Context, runtime: Runtime[Any], name: str, persona: Persona) -> Any:
    store = getattr(runtime, "store", None)
    uri = ctx.dual(store).uri if store is not None else None
    return A.open_memory(ctx, name, persona, uri)


def outline(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Plan the user's projects from the persona and goals."""
    res, persona, opts = _ctx(state, runtime)
    out = A.ask(
        res, [HumanMessage(content=P.OUTLINE_USER.format(n=opts.projects, persona=persona.render()))], A.ProjectOutline
    )
    if out.value is None or not out.value.projects:
        return {"projects": [], "issues": [{"stage": "outline", "reason": out.error or "no projects"}]}
    return {"projects": [p.model_dump() for p in out.value.projects]}


def events(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Write the event sequence and schedule it into dated sessions."""
    res, persona, opts = _ctx(state, runtime)
    projects = "\n".join(f"- {p['title']} (topic: {p['topic']}): {p['goal']}" for p in state["projects"])
    out = A.ask(
        res,
        [HumanMessage(content=P.EVENTS_USER.format(n=opts.sessions, persona=persona.render(), projects=projects))],
        A.EventPlan,
    )
    if out.value is None:
        return {"events": [], "issues": [{"stage": "events", "reason": out.error}]}
    planned = A.schedule(
        state["projects"],
        [e.model_dump() for e in out.value.events],
        opts.sessions,
        cooldown=opts.cooldown,
        parallel=opts.parallel_projects,
        seed=opts.seed,
        start_date=opts.start_date,
    )
    issues = (
        []
        if len(planned) == opts.sessions
        else [{"stage": "events", "reason": f"shortfall: {len(planned)} of {opts.sessions} sessions planned"}]
    )
    return {"events": planned, "issues": issues}


def plans(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Write each session's summary and goal; start the first session."""
    res, persona, _ = _ctx(state, runtime)
    evs = state["events"]
    lines = "\n".join(f"{e['index'] + 1}. {e['date']} [{e['project']}] {A.event_text(e)}" for e in evs)
    out = A.ask(
        res,
        [HumanMessage(content=P.SUMMARIES_USER.format(n=len(evs), persona=persona.render(), schedule=lines))],
        A.SessionPlans,
    )
    got = [p.model_dump() for p in out.value.sessions] if out.value is not None else []
    issues = (
        []
        if len(got) >= len(evs)
        else [
            {"stage": "plans", "reason": out.error or f"{len(got)} of {len(evs)} session plans; filled from the events"}
        ]
    )
    filled = [
        got[i] if i < len(got) else {"summary": A.event_text(e), "goal": f"get help with: {e['title']}"}
        for i, e in enumerate(evs)
    ]
    return {
        "plans": filled,
        "cursor": 0,
        "turns": [],
        "retrieved": [],
        "known_points": [],
        "blocked": "",
        "goal_met": False,
        "issues": issues,
    }


QUERY_CATEGORY = "Dynamic Incremental"  # RealMem's category of a query answered from earlier sessions' memory


def _session_id(state: SimState, index: int) -> str:
    """Return a session's uuid: 8 hex digits, as RealMem's ``session_uuid``."""
    return stable_id(state["persona"].get("id"), A.SimulateOptions.of(state.get("options")).seed, index, prefix="")[-8:]


def realmem_topic(topic: str) -> str:
    """Return a topic as RealMem spells it (``travel planning`` → ``Travel_Planning``)."""
    return "_".join(w[:1].upper() + w[1:] for w in re.split(r"[\s_-]+", topic.strip()) if w) or "General"


def session_identifier(events: list[dict[str, Any]], index: int) -> str:
    """Return RealMem's ``session_identifier`` of a session: ``<Topic>_<project no.>:S<n>_01``, ``n`` counted per project."""
    projects = list(dict.fromkeys(e["project"] for e in events))
    event = events[index]
    n = sum(1 for e in events[: index + 1] if e["project"] == event["project"])
    return f"{realmem_topic(event['topic'])}_{projects.index(event['project']) + 1}:S{n}_01"


def realmem_time(date: str) -> str:
    """Return a schedule date as RealMem's ``current_time`` (``2024-03-05 (Tuesday)``)."""
    day = datetime.fromisoformat(date)
    return f"{day:%Y-%m-%d} ({day:%A})"


def user_turn(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """The user agent writes the next message (seeing only past and current events)."""
    res, persona, _ = _ctx(state, runtime)
    message, error = A.user_message(
        res, persona, state["events"], state["plans"], state["cursor"], state.get("turns") or []
    )
    if message is None:
        return {"blocked": error, "issues": [{"stage": "user", "session": state["cursor"], "reason": error}]}
    return {"turns": [*(state.get("turns") or []), {"role": "user", "text": message, "meta": {}}]}


def assistant_turn(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """The assistant retrieves earlier sessions and replies; memory use marks the user turn as a query."""
    res, persona, opts = _ctx(state, runtime)
    turns = [dict(t) for t in state["turns"]]
    event = state["events"][state["cursor"]]
    memory = _memory(res, runtime, opts.framework, persona)
    reply, retrieved, used, error = A.assistant_reply(res, persona, memory, event["date"], turns, opts.k)
    if reply is None:
        return {"blocked": error, "issues": [{"stage": "assistant", "session": state["cursor"], "reason": error}]}
    update: dict[str, Any] = {"retrieved": [*(state.get("retrieved") or []), *(it.text for it in retrieved)]}
    if used:
        sid = _session_id(state, state["cursor"])
        qid = stable_id(sid, len(turns) - 1, prefix="q-")
        memory_used = [{"session_uuid": it.source_session or "", "content": it.text} for it in used]
        gold_sessions = list(dict.fromkeys(m["session_uuid"] for m in memory_used if m["session_uuid"]))
        turns[-1]["meta"] = {**turns[-1].get("meta", {}), "is_query": True, "query_id": qid}
        query = Query(
            id=qid,
            text=turns[-1]["text"],
            category=QUERY_CATEGORY,
            session_id=sid,
            turn_index=len(turns) - 1,
            time=realmem_time(event["date"]),
            gold=GoldEvidence(session_ids=gold_sessions, memory_points=[m["content"] for m in memory_used]),
            meta={
                "memory_used": memory_used,
                "topic": realmem_topic(event["topic"]),
                "session_type": "multi_session" if len(gold_sessions) > 1 else "single_session",
            },
        )
        update["queries"] = [query.model_dump(mode="json")]
    update["turns"] = [*turns, {"role": "assistant", "text": reply, "meta": {}}]
    return update


def evaluate(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """The goal evaluator decides whether the session may end."""
    res, _, _ = _ctx(state, runtime)
    met, _reason = A.goal_met(res, state["plans"][state["cursor"]]["goal"], state["turns"])
    return {"goal_met": met}


def close_session(state: SimState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Extract and deduplicate memory points, store the session, ingest it into memory, move on."""
    res, persona, opts = _ctx(state, runtime)
    index, turns = state["cursor"], state.get("turns") or []
    event, sid = state["events"][index], _session_id(state, index)
    known = state.get("known_points") or []
    issues = []
    points, error = A.extract_memory(res, persona, turns, known) if turns else ([], "")
    if error:
        issues.append({"stage": "memory", "session": index, "reason": error})
    fresh, dupes = A.dedupe(points, [*(state.get("retrieved") or []), *known], opts.dedup_overlap)
    ident = session_identifier(state["events"], index)
    memory_points = [  # RealMem's conventions: "Dynamic", 1-based source turns, indexes <project>-SM-<session>-NN
        MemoryPoint(
            id=f"{ident.replace(':', '-SM-')}-{j + 1:02d}",
            type=p["type"].capitalize(),
            content=p["content"],
            source_turn=None if p["source_turn"] is None else p["source_turn"] + 1,
            session_id=sid,
        )
        for j, p in enumerate(fresh)
    ]
    session = Session(
        id=sid,
        time=realmem_time(event["date"]),
        turns=[
            Turn(
                id=f"{sid}:{i}",
                role=t["role"],
                speaker="User" if t["role"] == "user" else "Assistant",
                text=t["text"],
                is_query=bool(t.get("meta", {}).get("is_query")),
                query_id=t.get("meta", {}).get("query_id"),
            )
            for i, t in enumerate(turns)
        ],
        memory_points=memory_points,
        meta={
            "session_identifier": ident,
            "project": event["project"],
            "topic": event["topic"],
            "event": A.event_text(event),
            "goal": state["plans"][index]["goal"],
            "goal_met": bool(state.get("goal_met")),
            "ended_by": state.get("blocked") or ("goal" if state.get("goal_met") else "turn limit"),
            "duplicates_dropped": len(dupes),
        },
    )
    if turns:
        _memory(res, runtime, opts.framework, persona).ingest(session)
    else:
        issues.append(
            {
                "stage": "session",
                "session": index,
                "reason": f"session {index + 1} dropped: no turns ({state.get('blocked') or 'empty'})",
            }
        )
    return {
        "sessions": [session.model_dump(mode="json")] if turns else [],
        "issues": issues,
        "cursor": index + 1,
        "turns": [],
        "retrieved": [],
        "blocked": "",
        "goal_met": False,
        "known_points": [*known, *(p.content for p in memory_points)],
    }


def finish(state: SimState) -> dict[str, Any]:
    """Assemble the RealMem JSON of the simulated history."""
    persona = Persona.model_validate(state["persona"])
    sessions = [Session.model_validate(s) for s in sorted(state.get("sessions") or [], key=lambda s: s["time"] or "")]
    queries = [Query.model_validate(q) for q in state.get("queries") or []]
    # RealMem numbers its queries Q-0001, Q-0002… in file order
    order = {
        (s.id, i): n for n, (s, i) in enumerate((s, i) for s in sessions for i, t in enumerate(s.turns) if t.query_id)
    }
    renamed = {q.id: f"Q-{order.get((q.session_id or '', q.turn_index or 0), len(order)) + 1:04d}" for q in queries}
    queries = [q.model_copy(update={"id": renamed[q.id]}) for q in queries]
    for session in sessions:
        for turn in session.turns:
            if turn.query_id:
                turn.query_id = renamed.get(turn.query_id, turn.query_id)
    meta = {
        "generator": "dualmem simulate",
        "options": state.get("options") or {},
        "issues": state.get("issues") or [],
        "schedule": [
            {
                "session_uuid": _session_id(state, e["index"]),
                "date": e["date"],
                "project": e["project"],
                "topic": e["topic"],
                "event": A.event_text(e),
            }
            for e in state.get("events") or []
        ],
    }
    return {"realmem": realmem_json(Dialogue(id=persona.id, persona=persona, sessions=sessions, meta=meta), queries)}


def after_outline(state: SimState) -> Literal["events", "finish"]:
    """Plan events, or finish when no project could be planned."""
    return "events" if state.get("projects") else "finish"


def after_plans(state: SimState) -> Literal["user_turn", "finish"]:
    """Start the first session, or finish when nothing was planned."""
    return "user_turn" if state.get("events") else "finish"


def after_user(state: SimState) -> Literal["assistant_turn", "close_session"]:
    """Close the session when the user agent could not go on."""
    return "close_session" if state.get("blocked") else "assistant_turn"


def after_assistant(state: SimState) -> Literal["evaluate", "close_session"]:
    """Close the session when the assistant could not answer."""
    return "close_session" if state.get("blocked") else "evaluate"


def after_evaluate(state: SimState) -> Literal["user_turn", "close_session"]:
    """End the session when its goal is met or at the turn limit."""
    limit = A.SimulateOptions.of(state.get("options")).max_turns
    users = sum(1 for t in state.get("turns") or [] if t["role"] == "user")
    return "close_session" if state.get("goal_met") or users >= limit else "user_turn"


def after_close(state: SimState) -> Literal["user_turn", "finish"]:
    """Go on with the next session, or finish."""
    return "user_turn" if state.get("cursor", 0) < len(state.get("events") or []) else "finish"
