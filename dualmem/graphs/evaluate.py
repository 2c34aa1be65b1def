"""The evaluate graph: dataset × frameworks → one branch per persona × framework → summaries.

Nodes live in :mod:`dualmem.nodes.evaluate`: ``plan`` lists the personas,
``fan_out`` sends one ``run_unit`` per persona × framework (at most
``max_concurrency`` at once), each run in this process or on a Ray cluster
by the run's runner, ``aggregate`` summarises per framework. A unit the run
record holds finished is read back, not run. :func:`dualmem.evaluate.run_eval`
(``dualmem eval``) drives it with the run's record, judges and runner; under
``langgraph dev`` it runs in-process with the context's settings.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from dualmem.context import Context
from dualmem.nodes.evaluate import EvalState, UnitTask, aggregate, fan_out, plan, run_unit

builder = StateGraph(EvalState, context_schema=Context)
builder.add_node("plan", plan)
builder.add_node("run_unit", run_unit, input_schema=UnitTask)
builder.add_node("aggregate", aggregate)
builder.add_edge(START, "plan")
builder.add_conditional_edges("plan", fan_out, ["run_unit"])
builder.add_edge("run_unit", "aggregate")
builder.add_edge("aggregate", END)
graph = builder.compile()
graph.name = "evaluate"
