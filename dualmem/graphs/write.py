"""The recurrent memory writer graph, for the LangGraph server and chat: history → chunks → each written once → report.

Nodes live in :mod:`dualmem.nodes.write`; with ``pending`` in the input the graph forms a chat thread's pending
turns instead (:mod:`dualmem.chat.formation`). The graph reads its store from ``runtime.store`` — the server's
(``langgraph.json``) — and its context is :class:`~dualmem.context.Context`. Running it again on the same input, in
any process, resumes: applied chunks are skipped, a plan drafted before a crash is applied, failed chunks are asked
again. In Python, :func:`dualmem.writer.write_history` runs the same core without a graph.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from dualmem.context import Context
from dualmem.nodes.write import WriteInput, WriteState, form, prepare, route, start, write

builder = StateGraph(WriteState, context_schema=Context, input_schema=WriteInput)
builder.add_node("prepare", prepare)
builder.add_node("write", write)
builder.add_node("form", form)
builder.add_conditional_edges(START, start, ["prepare", "form"])
builder.add_conditional_edges("prepare", route, ["write", END])
builder.add_conditional_edges("write", route, ["write", END])
builder.add_edge("form", END)
graph = builder.compile()
graph.name = "write"


__all__ = ["builder", "graph"]
