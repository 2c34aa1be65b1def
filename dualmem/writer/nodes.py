"""Nodes of the writer graph: cut the history into chunks, write them one by one exactly once.

``prepare`` chunks the sessions (or takes ready ``chunks``, or the failed ones
with ``retry_failed``, or, with ``pending: {"thread", "flush"}``, seals a chat
thread's pending turns into chunks: :mod:`dualmem.chat.formation`); ``write`` writes the chunk at ``cursor`` through
:func:`dualmem.writer.core.write_chunk` (under the namespace's write lease, with
the pending-plan ledger) and records its report row; ``route`` loops. A chunk
whose answer stays malformed after the repairs, or whose model call fails, is
recorded in ``failed_chunks`` with its reason — never dropped. In pending mode
``settle`` then removes the written turns from the thread and reports what is
left (``formed``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from dualmem.context import Context, context_of
from dualmem.schema import Persona
from dualmem.writer.chunking import Chunk, as_sessions, chunk_sessions
from dualmem.writer.core import write_chunk
from dualmem.writer.sealing import settle_pending, take_pending


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
    """Input of the writer graph: persona, sessions (or ready chunks, or a chat thread's pending turns), optional namespace or ``retry_failed``."""

    persona: dict[str, Any]
    sessions: list[dict[str, Any]]
    chunks: list[Chunk]
    pending: PendingJob | None
    namespace: list[str]
    retry_failed: bool


class WriteState(WriteInput, total=False):
    """State of the writer graph (``report`` holds the rows of the latest run)."""

    cursor: int
    report: Annotated[list[dict[str, Any]], merge_rows]
    failed_chunks: Annotated[list[dict[str, Any]], merge_rows]
    formed: dict[str, Any]


def namespace_of(state: WriteState, ctx: Context) -> tuple[str, ...]:
    """Return the namespace written: the input's, else (persona id, the context's user)."""
    if state.get("namespace"):
        return tuple(state["namespace"])
    return (Persona.model_validate(state["persona"]).id, ctx.user_id)


def prepare(state: WriteState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Chunk the sessions (or take the given chunks, the failed ones when ``retry_failed``, or a chat thread's pending turns)."""
    ctx = context_of(runtime)
    namespace = namespace_of(state, ctx)
    reset = [{"chunk_id": r["chunk_id"], "drop": True} for r in state.get("report") or []]
    update: dict[str, Any] = {"cursor": 0, "namespace": list(namespace), "report": reset, "sessions": []}
    if state.get("retry_failed"):
        failed = [f for f in state.get("failed_chunks") or [] if f.get("chunk")]
        drops = [{"chunk_id": f["chunk_id"], "drop": True} for f in failed]
        return {**update, "chunks": [f["chunk"] for f in failed], "retry_failed": False, "failed_chunks": drops}
    if state.get("pending"):
        return {**update, **take_pending(dict(state), runtime, namespace)}
    update["pending"] = None
    if state.get("sessions"):
        return {**update, "chunks": chunk_sessions(as_sessions(state["sessions"]), namespace, ctx.chunk_tokens)}
    return {**update, "chunks": list(state.get("chunks") or [])}


def write(state: WriteState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Write the chunk at ``cursor`` exactly once, record its report row, move to the next chunk."""
    ctx = context_of(runtime)
    chunk = state["chunks"][state["cursor"]]
    persona = Persona.model_validate(state["persona"])
    row = write_chunk(ctx, ctx.dual(runtime.store), tuple(state["namespace"]), persona, chunk)
    update: dict[str, Any] = {"report": [row], "cursor": state["cursor"] + 1}
    if row["status"] == "failed":
        entry = {"chunk_id": row["chunk_id"], "index": row["index"], "error": row.get("error"), "attempts": row.get("attempts")}
        update["failed_chunks"] = [{**entry, "chunk": chunk}]
    else:
        update["failed_chunks"] = [{"chunk_id": row["chunk_id"], "drop": True}]
    return update


def settle(state: WriteState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Remove the chat thread's turns whose chunks are applied; report what it still has pending."""
    return settle_pending(dict(state), runtime)


def route(state: WriteState) -> Literal["write", "settle", "__end__"]:
    """Go on with the next chunk, or settle a chat thread's written turns, or end."""
    if state.get("cursor", 0) < len(state.get("chunks") or []):
        return "write"
    return "settle" if state.get("pending") else "__end__"


@dataclass
class WriteReport:
    """What a writer call did, one row per chunk of the history (``skipped`` = applied before)."""

    namespace: tuple[str, ...]
    thread_id: str
    chunks: list[dict[str, Any]] = field(default_factory=list)
    failed_chunks: list[dict[str, Any]] = field(default_factory=list)

    def _ops(self, stream: str) -> int:
        return sum(
            1
            for row in self.chunks
            if row.get("status") == "applied"
            for op in row.get("applied") or []
            if op["stream"] == stream and op["op"] in ("ADD", "UPDATE")
        )

    @property
    def facts_written(self) -> int:
        """Return the facts added or updated."""
        return self._ops("fact")

    @property
    def insights_written(self) -> int:
        """Return the insights added or updated."""
        return self._ops("insight")

    @property
    def rejected(self) -> int:
        """Return the operations rejected by validation."""
        return sum(len(row.get("rejected") or []) for row in self.chunks)

    @property
    def flagged_turns(self) -> list[dict[str, Any]]:
        """Return the turns the guard flagged as requests to change the persona's memory (once each)."""
        seen: dict[str, dict[str, Any]] = {}
        for row in self.chunks:
            for flag in row.get("flagged") or []:
                seen.setdefault(flag["turn_id"], flag)
        return list(seen.values())

    @property
    def guard_rejected(self) -> int:
        """Return the operations the memory-poisoning guard rejected."""
        return sum(1 for row in self.chunks for op in row.get("rejected") or [] if str(op.get("reason", "")).startswith("guard:"))

    @property
    def request_facts(self) -> int:
        """Return the facts kept as requests to change the persona's memory (what the user asked)."""
        return sum(1 for row in self.chunks if row.get("status") == "applied" for op in row.get("applied") or [] if op.get("request"))

    @property
    def llm_calls(self) -> int:
        """Return the writer model calls (repairs included)."""
        return sum(int(row.get("attempts") or 0) for row in self.chunks)

    @property
    def prompt_tokens(self) -> list[int]:
        """Return the prompt size of every drafted chunk, in chunk order."""
        return [int(row["prompt_tokens"]) for row in self.chunks if row.get("prompt_tokens")]

    def summary(self) -> str:
        """Return a one-line summary."""
        return (
            f"{len(self.chunks)} chunks, {self.facts_written} facts and {self.insights_written} insights written, "
            f"{self.rejected} ops rejected, {len(self.failed_chunks)} chunk(s) failed, {self.llm_calls} model calls, "
            f"{len(self.flagged_turns)} turn(s) flagged as requests to change the persona's memory "
            f"({self.request_facts} kept as request facts, {self.guard_rejected} ops rejected by the guard)"
        )


def failed_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the failed chunks of report rows (id, index, error, attempts)."""
    keys = ("chunk_id", "index", "error", "attempts")
    return [{k: r.get(k) for k in keys} for r in rows if r.get("status") == "failed"]
