"""The RoleMemo ``weave`` graph: personas → insights → checked, woven queries → long histories.

``START`` fans out one ``ideate`` branch per persona (``Send``); ``plan``
fans out one ``make_query`` branch per insight not yet done (specificity →
fragments + question → memory necessity → weaving + difficulty → safety);
``assemble`` builds the histories of every target length and the manifest.
Branches run with bounded concurrency (``max_concurrency`` =
``Settings.evaluation.concurrency``). Under a checkpointer a killed run resumes with
every finished branch kept: nothing is asked of the model twice.

Input: ``{"personas": [persona dicts], "options": WeaveOptions.as_dict()}``.
Context: :class:`~dualmem.context.Context` (settings plus injected models; a dict of settings from the server).
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from dualmem.context import Context
from dualmem.nodes.weave import (
    WeaveState,
    assemble,
    fan_insights,
    fan_personas,
    ideate_persona,
    make_query,
    plan,
)

builder = StateGraph(WeaveState, context_schema=Context)
builder.add_node("ideate", ideate_persona)
builder.add_node("plan", plan)
builder.add_node("make_query", make_query)
builder.add_node("assemble", assemble)
builder.add_conditional_edges(START, fan_personas, ["ideate", "plan"])
builder.add_edge("ideate", "plan")
builder.add_conditional_edges("plan", fan_insights, ["make_query", "assemble"])
builder.add_edge("make_query", "assemble")
builder.add_edge("assemble", END)
graph = builder.compile()
graph.name = "weave"
