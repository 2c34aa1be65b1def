"""The recurrent memory writer graph: history → chunks → (draft → apply)* → report.

``prepare`` cuts the sessions into chunks; then, chunk by chunk, ``draft``
recalls the working view, asks the writer model (as the persona) for a
``MemoryUpdate`` and validates it into a plan, and ``apply`` writes the plan to
the dual store once (chunk ledger). Under a checkpointer (SQLite by default in
:func:`write_history`) a killed run resumes from its last step: a plan drafted
before the crash is applied, never re-asked. A chunk whose answer stays
malformed after the repairs is recorded in ``failed_chunks``; run again with
``retry_failed=True`` (or :func:`retry_failed`) to redo only those.

Context: ``Settings`` (or a dict of settings; ``langgraph dev`` passes one) or
:class:`~dualmem.nodes.writer.WriterResources` carrying a model and a store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typing_extensions import TypedDict

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.nodes.chunking import Chunk, as_sessions, chunk_sessions
from dualmem.nodes.writer import Draft, SettingsContext, WriterResources, apply_draft, draft_chunk, resources
from dualmem.schema import Dialogue, Persona, Session, stable_id
from dualmem.stores.dual import DualStore


def merge_rows(left: list[dict[str, Any]] | None, right: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Merge report rows by ``chunk_id`` (a newer row replaces; ``{"chunk_id", "drop": True}`` removes)."""
    rows = {r["chunk_id"]: r for r in left or []}
    for row in right or []:
        if row.get("drop"):
            rows.pop(row["chunk_id"], None)
        else:
            rows[row["chunk_id"]] = row
    return list(rows.values())


class WriteInput(TypedDict, total=False):
    """Input of the writer graph: the persona, the sessions, optionally a namespace or ``retry_failed``."""

    persona: dict[str, Any]
    sessions: list[dict[str, Any]]
    namespace: list[str]
    retry_failed: bool


class WriteState(WriteInput, total=False):
    """State of the writer graph."""

    chunks: list[Chunk]
    cursor: int
    draft: Draft | None
    report: Annotated[list[dict[str, Any]], merge_rows]
    failed_chunks: Annotated[list[dict[str, Any]], merge_rows]


def _namespace(state: WriteState, settings: Settings) -> tuple[str, ...]:
    if state.get("namespace"):
        return tuple(state["namespace"])
    return (Persona.model_validate(state["persona"]).id, settings.user_id)


def prepare(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Chunk the sessions (or pick the failed chunks when ``retry_failed``)."""
    settings = resources(runtime.context).settings
    namespace = _namespace(state, settings)
    if state.get("retry_failed"):
        failed = {f["chunk_id"] for f in state.get("failed_chunks") or []}
        chunks = [c for c in state.get("chunks") or [] if c["id"] in failed]
        drops = [{"chunk_id": cid, "drop": True} for cid in failed]
        return {"chunks": chunks, "cursor": 0, "draft": None, "retry_failed": False, "namespace": list(namespace), "failed_chunks": drops}
    chunks = chunk_sessions(as_sessions(state.get("sessions") or []), namespace, settings.chunk_tokens)
    return {"chunks": chunks, "cursor": 0, "draft": None, "namespace": list(namespace)}


def _current(state: WriteState) -> Chunk:
    return state["chunks"][state["cursor"]]


def draft(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Recall the view, ask the writer model, validate its answer into a plan."""
    res = resources(runtime.context)
    persona = Persona.model_validate(state["persona"])
    return {"draft": draft_chunk(res, tuple(state["namespace"]), persona, _current(state))}


def apply(state: WriteState, runtime: Runtime[Any]) -> dict[str, Any]:
    """Apply the drafted plan once, record the chunk's report row, move to the next chunk."""
    res = resources(runtime.context)
    current = state["draft"]
    if current is None:
        raise RuntimeError("apply reached without a draft; the graph's edges are broken")
    row = apply_draft(res, tuple(state["namespace"]), current)
    earlier = {r["chunk_id"]: r for r in state.get("report") or []}.get(row["chunk_id"])
    keep = row["status"] == "skipped" and earlier is not None and earlier.get("status") == "applied"
    update: dict[str, Any] = {"report": [] if keep else [row], "cursor": state["cursor"] + 1, "draft": None}
    if row["status"] == "failed":
        update["failed_chunks"] = [{"chunk_id": row["chunk_id"], "index": row["index"], "error": row.get("error"), "attempts": row.get("attempts")}]
    return update


def route(state: WriteState) -> Literal["draft", "__end__"]:
    """Go on with the next chunk, or end."""
    return "draft" if state.get("cursor", 0) < len(state.get("chunks") or []) else "__end__"


builder = StateGraph(WriteState, context_schema=SettingsContext, input_schema=WriteInput)
builder.add_node("prepare", prepare)
builder.add_node("draft", draft)
builder.add_node("apply", apply)
builder.add_edge(START, "prepare")
builder.add_conditional_edges("prepare", route, ["draft", END])
builder.add_edge("draft", "apply")
builder.add_conditional_edges("apply", route, ["draft", END])
graph = builder.compile()
graph.name = "write"


# --------------------------------------------------------------------------- Python API


@dataclass
class WriteReport:
    """What a writer run did, chunk by chunk (also the graph's final state)."""

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
            f"{self.rejected} ops rejected, {len(self.failed_chunks)} chunk(s) failed, {self.llm_calls} model calls"
        )


@dataclass
class _Job:
    inputs: dict[str, Any]
    context: WriterResources
    config: RunnableConfig
    chunk_ids: list[str]
    namespace: tuple[str, ...]
    thread_id: str
    checkpoint_path: str | None


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
    sessions = as_sessions(history)
    chunk_ids = [c["id"] for c in chunk_sessions(sessions, ns, settings.chunk_tokens)]
    res = WriterResources(settings, model=None if model is None else load_chat_model(model, settings, role="writer"), store=store, embeddings=embeddings)
    thread = thread_id or stable_id("write", *ns, prefix="write-")
    inputs: dict[str, Any] = {"persona": who.model_dump(mode="json"), "sessions": [s.model_dump(mode="json") for s in sessions], "namespace": list(ns)}
    config = RunnableConfig(configurable={"thread_id": thread}, recursion_limit=2 * len(chunk_ids) + 16)
    path = settings.checkpoint_path if checkpointer is None else None
    if path and path != ":memory:":
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return _Job(inputs, res, config, chunk_ids, ns, thread, path)


def _report(job: _Job, values: dict[str, Any]) -> WriteReport:
    rows = sorted(values.get("report") or [], key=lambda r: r.get("index", 0))
    return WriteReport(job.namespace, job.thread_id, chunks=rows, failed_chunks=list(values.get("failed_chunks") or []))


def _runs(job: _Job, saved: Any, retry: bool) -> list[dict[str, Any] | None]:
    """Return the inputs of the runs to do: resume a pending run first, then the asked one."""
    if saved is None:  # no checkpointer: the ledger skips what was applied, failed chunks are redone
        return [job.inputs]
    pending = bool(saved.next)
    runs: list[dict[str, Any] | None] = [None] if pending else []
    same = [c["id"] for c in saved.values.get("chunks") or []] == job.chunk_ids
    if retry and saved.values.get("chunks"):
        runs.append({"retry_failed": True})
    elif not (pending and same):
        runs.append(job.inputs)
    return runs


def _track(bar: Progress, task: Any, mode: Any, chunk: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Advance the bar on applied chunks; return the latest full state."""
    if mode == "values":
        return chunk
    if "prepare" in chunk:
        bar.update(task, total=len(chunk["prepare"].get("chunks") or []), completed=0)
    if "apply" in chunk:
        bar.advance(task)
    return values


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]writing memory"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
        disable=not enabled, transient=False,
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
    retry_failed: bool = False,
) -> WriteReport:
    """Write a history into memory through ``persona``; resumable by ``thread_id``.

    ``checkpointer``: None = SQLite at ``settings.checkpoint_path``; False = none
    (the chunk ledger still makes re-runs idempotent); or a LangGraph saver.
    """
    job = _job(history, persona, settings, model, store, embeddings, namespace, thread_id, checkpointer)
    conn = sqlite3.connect(job.checkpoint_path, check_same_thread=False) if job.checkpoint_path else None
    try:
        saver = SqliteSaver(conn) if conn is not None else (checkpointer or None)
        runnable = builder.compile(checkpointer=saver)
        saved = runnable.get_state(job.config) if saver else None
        values: dict[str, Any] = {}
        with _progress(progress) as bar:
            task = bar.add_task("write", total=len(job.chunk_ids))
            for inputs in _runs(job, saved, retry_failed):
                for mode, chunk in runnable.stream(cast(Any, inputs), job.config, context=cast(Any, job.context), stream_mode=["updates", "values"]):
                    values = _track(bar, task, mode, chunk, values)
    finally:
        if conn is not None:
            conn.close()
    return _report(job, values)


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
    retry_failed: bool = False,
) -> WriteReport:
    """Async :func:`write_history` (same graph and nodes, async SQLite checkpointer)."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    job = _job(history, persona, settings, model, store, embeddings, namespace, thread_id, checkpointer)
    conn = await aiosqlite.connect(job.checkpoint_path) if job.checkpoint_path else None
    try:
        saver = AsyncSqliteSaver(conn) if conn is not None else (checkpointer or None)
        runnable = builder.compile(checkpointer=saver)
        saved = (await runnable.aget_state(job.config)) if saver else None
        values: dict[str, Any] = {}
        with _progress(progress) as bar:
            task = bar.add_task("write", total=len(job.chunk_ids))
            for inputs in _runs(job, saved, retry_failed):
                async for mode, chunk in runnable.astream(cast(Any, inputs), job.config, context=cast(Any, job.context), stream_mode=["updates", "values"]):
                    values = _track(bar, task, mode, chunk, values)
    finally:
        if conn is not None:
            await conn.close()
    return _report(job, values)


def retry_failed(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None = None,
    **kwargs: Any,
) -> WriteReport:
    """Redo only the failed chunks of a checkpointed thread (same arguments as :func:`write_history`)."""
    return write_history(history, persona, retry_failed=True, **kwargs)
