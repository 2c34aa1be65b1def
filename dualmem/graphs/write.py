"""The recurrent memory writer graph: history → chunks → (draft → apply)* → report.

``prepare`` cuts the sessions into chunks (or takes ready ``chunks``, or, with
``pending: {"thread", "flush"}``, seals a chat thread's pending turns into
chunks: :mod:`dualmem.chat.formation`); then,
chunk by chunk, ``draft`` recalls the working view, asks the writer model (as
the persona) for a ``MemoryUpdate`` and validates it into a plan, and ``apply``
writes the plan to the dual store once (chunk ledger). Under a checkpointer a
killed run resumes from its last step: a plan drafted before the crash is
applied, never re-asked. A chunk whose answer stays malformed after the
repairs is recorded in ``failed_chunks``; run the thread again with
``retry_failed=True`` to redo only those. In pending mode ``settle`` then
removes the written turns from the thread and reports what is left (``formed``).

:func:`write_history` is the Python API: it checkpoints to SQLite
(``settings.checkpoint_path``) and feeds the graph ``BATCH_CHUNKS`` chunks per
run, so each checkpoint stays small however long the history (SQLite
checkpoints store the whole state at every step). Chunks already in the
store's ledger are skipped, so re-running it also retries failed chunks.

Context: ``Settings`` (or a dict of settings; ``langgraph dev`` passes one) or
:class:`~dualmem.nodes.writer.WriterResources` carrying a model and a store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typing_extensions import TypedDict

from dualmem.chat.formation import settle_pending, take_pending
from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.nodes.chunking import Chunk, as_sessions, chunk_sessions
from dualmem.nodes.writer import Draft, SettingsContext, WriterResources, apply_draft, draft_chunk, resources
from dualmem.preflight import check_file_path, check_model, check_store_uri, needs_check
from dualmem.schema import Dialogue, Persona, Session, stable_id
from dualmem.stores.dual import DualStore
from dualmem.stores.langgraph_store import LanceDBStore


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
    draft: Draft | None
    report: Annotated[list[dict[str, Any]], merge_rows]
    failed_chunks: Annotated[list[dict[str, Any]], merge_rows]
    formed: dict[str, Any]


def _namespace(state: WriteState, settings: Settings) -> tuple[str, ...]:
    if state.get("namespace"):
        return tuple(state["namespace"])
    return (Persona.model_validate(state["persona"]).id, settings.user_id)


def prepare(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Chunk the sessions (or take the given chunks, the failed ones when ``retry_failed``, or a chat thread's pending turns)."""
    settings = resources(runtime).settings
    namespace = _namespace(state, settings)
    reset = [{"chunk_id": r["chunk_id"], "drop": True} for r in state.get("report") or []]
    update: dict[str, Any] = {"cursor": 0, "draft": None, "namespace": list(namespace), "report": reset, "sessions": []}
    if state.get("retry_failed"):
        failed = [f for f in state.get("failed_chunks") or [] if f.get("chunk")]
        drops = [{"chunk_id": f["chunk_id"], "drop": True} for f in failed]
        return {**update, "chunks": [f["chunk"] for f in failed], "retry_failed": False, "failed_chunks": drops}
    if state.get("pending"):
        return {**update, **take_pending(dict(state), runtime, namespace)}
    update["pending"] = None
    if state.get("sessions"):
        return {**update, "chunks": chunk_sessions(as_sessions(state["sessions"]), namespace, settings.chunk_tokens)}
    return {**update, "chunks": list(state.get("chunks") or [])}


def _current(state: WriteState) -> Chunk:
    return state["chunks"][state["cursor"]]


def draft(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Recall the view, ask the writer model, validate its answer into a plan."""
    res = resources(runtime)
    persona = Persona.model_validate(state["persona"])
    return {"draft": draft_chunk(res, tuple(state["namespace"]), persona, _current(state))}


def apply(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Apply the drafted plan once, record the chunk's report row, move to the next chunk."""
    res = resources(runtime)
    current = state["draft"]
    if current is None:
        raise RuntimeError("apply reached without a draft; the graph's edges are broken")
    row = apply_draft(res, tuple(state["namespace"]), current)
    update: dict[str, Any] = {"report": [row], "cursor": state["cursor"] + 1, "draft": None}
    if row["status"] == "failed":
        entry = {"chunk_id": row["chunk_id"], "index": row["index"], "error": row.get("error"), "attempts": row.get("attempts")}
        update["failed_chunks"] = [{**entry, "chunk": _current(state)}]
    else:
        update["failed_chunks"] = [{"chunk_id": row["chunk_id"], "drop": True}]
    return update


def settle(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Remove the chat thread's turns whose chunks are applied; report what it still has pending."""
    return settle_pending(dict(state), runtime)


def route(state: WriteState) -> Literal["draft", "settle", "__end__"]:
    """Go on with the next chunk, or settle a chat thread's written turns, or end."""
    if state.get("cursor", 0) < len(state.get("chunks") or []):
        return "draft"
    return "settle" if state.get("pending") else "__end__"


builder = StateGraph(WriteState, context_schema=SettingsContext, input_schema=WriteInput)
builder.add_node("prepare", prepare)
builder.add_node("draft", draft)
builder.add_node("apply", apply)
builder.add_node("settle", settle)
builder.add_edge(START, "prepare")
builder.add_conditional_edges("prepare", route, ["draft", "settle", END])
builder.add_edge("draft", "apply")
builder.add_conditional_edges("apply", route, ["draft", "settle", END])
builder.add_edge("settle", END)
graph = builder.compile()
graph.name = "write"


# --------------------------------------------------------------------------- Python API

BATCH_CHUNKS = 8


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


def _failed(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("chunk_id", "index", "error", "attempts")
    return [{k: r.get(k) for k in keys} for r in rows if r.get("status") == "failed"]


@dataclass
class _Job:
    persona: dict[str, Any]
    context: WriterResources
    chunks: list[Chunk]
    namespace: tuple[str, ...]
    thread_id: str
    checkpoint_path: str | None

    def graph_store(self) -> LanceDBStore:
        """Return the LangGraph store view of the job's dual store (the graph's ``runtime.store``)."""
        db = self.context.db()
        return LanceDBStore(db.uri, dual=db)

    def config(self) -> RunnableConfig:
        return RunnableConfig(configurable={"thread_id": self.thread_id}, recursion_limit=2 * BATCH_CHUNKS + 16)

    def todo(self) -> list[Chunk]:
        """Return the chunks the ledger has not seen applied (new and failed ones)."""
        done = self.context.db().ledger.applied_ids(self.namespace)
        return [c for c in self.chunks if c["id"] not in done]

    def batches(self) -> list[dict[str, Any]]:
        todo = self.todo()
        return [
            {"persona": self.persona, "namespace": list(self.namespace), "chunks": todo[i : i + BATCH_CHUNKS]}
            for i in range(0, len(todo), BATCH_CHUNKS)
        ]

    def report(self, rows: dict[str, dict[str, Any]]) -> WriteReport:
        """Return rows in chunk order; chunks this call did not write were applied before."""
        out = []
        for chunk in self.chunks:
            row = rows.get(chunk["id"])
            if row is None:
                row = {"chunk_id": chunk["id"], "index": chunk["index"], "session_id": chunk["session_id"], "turn_ids": chunk["turn_ids"], "status": "skipped", "attempts": 0}
            out.append(row)
        return WriteReport(self.namespace, self.thread_id, chunks=out, failed_chunks=_failed(out))


def _job(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None,
    settings: Settings | dict[str, Any] | None,
    model: Any,
    store: DualStore | None,
    embeddings: Any,
    namespace: Iterable[str] | None,
    thread_id: str | None,
    checkpointer: Any,
) -> _Job:
    from dualmem.models import load_chat_model

    settings = Settings.resolve(settings)
    if persona is None and isinstance(history, Dialogue):
        persona = history.persona
    if persona is None:
        raise ConfigurationError("write_history needs a persona: pass persona=Persona(...) (the writer writes through it)")
    who = persona if isinstance(persona, Persona) else Persona.model_validate(persona)
    ns = tuple(namespace) if namespace else (who.id, settings.user_id)
    chunks = chunk_sessions(as_sessions(history), ns, settings.chunk_tokens)
    db = store if store is not None else DualStore.from_settings(settings, embeddings)
    res = WriterResources(settings, model=None if model is None else load_chat_model(model, settings, role="writer"), store=db, embeddings=embeddings)
    thread = thread_id or stable_id("write", *ns, prefix="write-")
    path = settings.checkpoint_path if checkpointer is None else None
    check_file_path(path or "")  # creates its folder, or says why it cannot
    if store is None:
        check_store_uri(settings.store_uri)
    if needs_check(settings.writer if model is None else res.model):  # one cheap call now, not a failure per chunk later
        check_model(res.chat(), settings)
    return _Job(who.model_dump(mode="json"), res, chunks, ns, thread, path)


def _collect(rows: dict[str, dict[str, Any]], bar: Progress, task: Any, update: Any) -> None:
    """Keep the report row of every chunk this call applied; advance the bar."""
    for row in (update.get("apply") or {}).get("report") or []:
        rows[row["chunk_id"]] = row
        bar.advance(task)


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]writing memory"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
        disable=not enabled,
    )


def write_history(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None = None,
    *,
    settings: Settings | dict[str, Any] | None = None,
    model: Any = None,
    store: DualStore | None = None,
    embeddings: Any = None,
    namespace: Iterable[str] | None = None,
    thread_id: str | None = None,
    progress: bool = True,
    checkpointer: Any = None,
) -> WriteReport:
    """Write a history into memory through ``persona``; resumable, and re-running retries failed chunks.

    ``checkpointer``: None = SQLite at ``settings.checkpoint_path``; False = none
    (the chunk ledger still makes re-runs idempotent); or a LangGraph saver.
    """
    job = _job(history, persona, settings, model, store, embeddings, namespace, thread_id, checkpointer)
    conn = sqlite3.connect(job.checkpoint_path, check_same_thread=False) if job.checkpoint_path else None
    rows: dict[str, dict[str, Any]] = {}
    try:
        runnable = builder.compile(checkpointer=SqliteSaver(conn) if conn is not None else (checkpointer or None), store=job.graph_store())
        context, config = cast(Any, job.context), job.config()
        with _progress(progress) as bar:
            task = bar.add_task("write", total=len(job.todo()))
            if runnable.checkpointer and runnable.get_state(config).next:  # a killed run: finish it first
                for update in runnable.stream(None, config, context=context, stream_mode="updates"):
                    _collect(rows, bar, task, update)
            for batch in job.batches():
                for update in runnable.stream(cast(Any, batch), config, context=context, stream_mode="updates"):
                    _collect(rows, bar, task, update)
    finally:
        if conn is not None:
            conn.close()
    return job.report(rows)


async def awrite_history(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None = None,
    *,
    settings: Settings | dict[str, Any] | None = None,
    model: Any = None,
    store: DualStore | None = None,
    embeddings: Any = None,
    namespace: Iterable[str] | None = None,
    thread_id: str | None = None,
    progress: bool = True,
    checkpointer: Any = None,
) -> WriteReport:
    """Async :func:`write_history` (same graph and nodes, async SQLite checkpointer)."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    job = _job(history, persona, settings, model, store, embeddings, namespace, thread_id, checkpointer)
    conn = await aiosqlite.connect(job.checkpoint_path) if job.checkpoint_path else None
    rows: dict[str, dict[str, Any]] = {}
    try:
        runnable = builder.compile(checkpointer=AsyncSqliteSaver(conn) if conn is not None else (checkpointer or None), store=job.graph_store())
        context, config = cast(Any, job.context), job.config()
        with _progress(progress) as bar:
            task = bar.add_task("write", total=len(job.todo()))
            if runnable.checkpointer and (await runnable.aget_state(config)).next:
                async for update in runnable.astream(None, config, context=context, stream_mode="updates"):
                    _collect(rows, bar, task, update)
            for batch in job.batches():
                async for update in runnable.astream(cast(Any, batch), config, context=context, stream_mode="updates"):
                    _collect(rows, bar, task, update)
    finally:
        if conn is not None:
            await conn.close()
    return job.report(rows)


def retry_failed(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None = None,
    **kwargs: Any,
) -> WriteReport:
    """Redo the chunks not applied yet (failed ones) of a history; applied chunks are skipped, not re-asked."""
    return write_history(history, persona, **kwargs)
