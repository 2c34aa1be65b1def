"""Nodes of the writer graph: cut the history into chunks, write them one by one exactly once.

``prepare`` chunks the sessions (or takes ready ``chunks``); ``write`` writes
the chunk at ``cursor`` through :func:`dualmem.writer.core.write_chunk` (under
the namespace's write lease, with the pending-plan ledger) and records its
report row; ``route`` loops. A chunk whose answer stays malformed after the
repairs, or whose model call fails, is recorded in ``failed_chunks`` with its
reason — never dropped; running the graph again on the same input asks it
again (applied chunks are skipped by the ledger).

With ``pending: {"thread", "flush"}`` the graph forms a chat thread's pending
turns instead: ``form`` seals them into chunks, writes each exactly once and
removes the written turns, all under one hold of the namespace's write lease
(:func:`dualmem.chat.sealing.form_pending`, what formation in this process
runs too), and reports what the thread still has pending (``formed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from dualmem.auth import whose_memory
from dualmem.chat.sealing import form_pending
from dualmem.context import Context, context_of
from dualmem.errors import ConfigurationError
from dualmem.memory.chunking import Chunk, as_sessions, chunk_sessions
from dualmem.schema import Persona, check_id
from dualmem.writer.core import write_chunk


def merge_rows(left: list[dict[str, Any]] | None, right: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Merge report rows by ``chunk_id`` (a newer row replaces; ``{"chunk_id", "drop": True}`` removes)."""
    rows = {r["chunk_id"]: r for r in left or []}
    for row in right or []:
        if row.get("drop"):
            rows.pop(row["chunk_id"], None)
        else:
            rows[row["chunk_id"]] = row
    return list(rows.values())


class PendingJob(TypedDict, total=False):
    """A chat thread whose pending turns to write (``flush``: the last, unfinished chunk too)."""

    thread: str
    flush: bool


class WriteInput(TypedDict, total=False):
    """Input of the writer graph: persona, sessions (or ready chunks, or a chat thread's pending turns), optional namespace."""

    persona: dict[str, Any]
    sessions: list[dict[str, Any]]
    chunks: list[Chunk]
    pending: PendingJob | None
    namespace: list[str]


class WriteState(WriteInput, total=False):
    """State of the writer graph (``report`` holds the rows of the latest run)."""

    cursor: int
    report: Annotated[list[dict[str, Any]], merge_rows]
    failed_chunks: Annotated[list[dict[str, Any]], merge_rows]
    formed: dict[str, Any]


def namespace_of(state: WriteState, ctx: Context, runtime: Any = None) -> tuple[str, ...]:
    """Return the namespace written: (persona, whose memory by :func:`dualmem.auth.whose_memory`).

    The input's ``namespace`` is a claim like the context's ``user_id``: on a server with authentication it must name
    the caller (else :class:`~dualmem.auth.AccessDenied`); without a persona in the input, its persona part is used.
    """
    given = [str(p) for p in state.get("namespace") or []]
    persona = Persona.model_validate(state["persona"]).id if state.get("persona") else (given[0] if given else "")
    if given and given[0] != persona:
        raise ConfigurationError(f"input namespace names persona {given[0]!r} but the input persona is {persona!r}")
    if not persona:
        raise ConfigurationError("the write graph needs `persona` in its input (a Persona as a dict)")
    return (check_id(persona, "persona id"), whose_memory(runtime, claimed=given[1:2], settings=ctx.settings))


def prepare(state: WriteState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Chunk the sessions (or take the given chunks)."""
    ctx = context_of(runtime)
    namespace = namespace_of(state, ctx, runtime)
    reset = [{"chunk_id": r["chunk_id"], "drop": True} for r in state.get("report") or []]
    chunks = list(state.get("chunks") or [])
    if state.get("sessions"):
        chunks = chunk_sessions(as_sessions(state["sessions"]), namespace, ctx.settings.tuning.chunk_tokens)
    update = {"cursor": 0, "namespace": list(namespace), "report": reset, "sessions": [], "pending": None}
    return {**update, "chunks": chunks}


def write(state: WriteState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Write the chunk at ``cursor`` exactly once, record its report row, move to the next chunk."""
    ctx = context_of(runtime)
    chunk = state["chunks"][state["cursor"]]
    persona = Persona.model_validate(state["persona"])
    row = write_chunk(ctx, ctx.dual(runtime.store), tuple(state["namespace"]), persona, chunk)  # a fresh view
    return {"report": [row], "cursor": state["cursor"] + 1, "failed_chunks": [_failed(row)]}


def _failed(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``failed_chunks`` entry of a report row (a failed chunk with its reason, else the drop of one)."""
    if row["status"] != "failed":
        return {"chunk_id": row["chunk_id"], "drop": True}
    return {
        "chunk_id": row["chunk_id"],
        "index": row["index"],
        "error": row.get("error"),
        "attempts": row.get("attempts"),
    }


def form(state: WriteState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Form a chat thread's pending turns (input ``pending``): seal, write each chunk exactly once, remove the written
    turns — under one hold of the namespace's write lease; report what the thread still has pending."""
    ctx = context_of(runtime)
    namespace = namespace_of(state, ctx, runtime)
    job = state["pending"] or {}
    rows, formed = form_pending(
        ctx, runtime.store, namespace, job["thread"], flush=bool(job.get("flush")), persona=state.get("persona")
    )
    reset = [{"chunk_id": r["chunk_id"], "drop": True} for r in state.get("report") or []]
    return {
        "namespace": list(namespace),
        "report": [*reset, *rows],
        "failed_chunks": [_failed(r) for r in rows],
        "formed": formed,
    }


def start(state: WriteInput) -> Literal["form", "prepare"]:
    """Form a chat thread's pending turns (input ``pending``), else write the history."""
    return "form" if state.get("pending") else "prepare"


def route(state: WriteState) -> Literal["write", "__end__"]:
    """Go on with the next chunk, or end."""
    return "write" if state.get("cursor", 0) < len(state.get("chunks") or []) else "__end__"
