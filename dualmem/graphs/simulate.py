"""The RealMem-style ``simulate`` graph: persona → projects → events → sessions of multi-agent dialogue.

``outline`` → ``events`` (scheduled: projects interleave, one topic rests
between projects, dates advance 1–3 days) → ``plans`` (summary and goal per
session) → per session a loop ``user_turn`` (the user agent sees only past
and current events; a time firewall rejects drafts naming a later event) →
``assistant_turn`` (retrieves earlier sessions through a memory framework;
the user turn becomes a query when memory was used) → ``evaluate`` (goal met
or turn limit) → ``close_session`` (memory manager extracts and deduplicates
memory points; the session is ingested into the framework) → ``finish``
(RealMem JSON). Checkpointed per turn.

Input: ``{"persona": persona dict, "options": SimulateOptions.as_dict()}``.
Context: :class:`~dualmem.context.Context` (settings plus injected models and memory framework; a dict of
settings from the server). The assistant's memory framework stores beside ``runtime.store`` when there is one.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from dualmem.context import Context
from dualmem.nodes.simulate import (
    SimState,
    after_assistant,
    after_close,
    after_evaluate,
    after_outline,
    after_plans,
    after_user,
    assistant_turn,
    close_session,
    evaluate,
    events,
    finish,
    outline,
    plans,
    user_turn,
)

builder = StateGraph(SimState, context_schema=Context)
for name, node in (
    ("outline", outline),
    ("events", events),
    ("plans", plans),
    ("user_turn", user_turn),
    ("assistant_turn", assistant_turn),
    ("evaluate", evaluate),
    ("close_session", close_session),
    ("finish", finish),
):
    builder.add_node(name, node)
builder.add_edge(START, "outline")
builder.add_conditional_edges("outline", after_outline, ["events", "finish"])
builder.add_edge("events", "plans")
builder.add_conditional_edges("plans", after_plans, ["user_turn", "finish"])
builder.add_conditional_edges("user_turn", after_user, ["assistant_turn", "close_session"])
builder.add_conditional_edges("assistant_turn", after_assistant, ["evaluate", "close_session"])
builder.add_conditional_edges("evaluate", after_evaluate, ["user_turn", "close_session"])
builder.add_conditional_edges("close_session", after_close, ["user_turn", "finish"])
builder.add_edge("finish", END)
graph = builder.compile()
graph.name = "simulate"
