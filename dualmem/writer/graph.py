"""The recurrent memory writer graph: history → chunks → write each chunk exactly once → report.

Nodes live in :mod:`dualmem.writer.nodes`: ``prepare`` cuts the sessions into
chunks (or seals a chat thread's pending turns: ``pending``), ``write`` writes
one chunk through the persona (under the namespace's write lease, with the
pending-plan ledger) and loops, ``settle`` removes a chat thread's written
turns (:mod:`dualmem.chat.formation`). The graph reads its store from
``runtime.store`` — the server's (``langgraph.json``), or the one
:func:`write_history` compiles it with — and its context is
:class:`~dualmem.context.Context` (any setting per run; ``langgraph dev``
passes a dict). A killed run, in any process, resumes where it stopped: applied
chunks are skipped, a plan drafted before the crash is applied, never re-asked.

:func:`write_history` is the Python API: it feeds the graph ``BATCH_CHUNKS``
chunks per run on a SQLite-checkpointed thread (``settings.checkpoint_path``),
so each checkpoint stays small however long the history. Re-running it also
retries failed chunks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typing_extensions import TypedDict, Unpack

from dualmem.config import Settings
from dualmem.context import Context, context_of
from dualmem.errors import ConfigurationError
from dualmem.preflight import check_file_path, check_model, needs_check
from dualmem.resume import arun_resumable, run_resumable
from dualmem.schema import Dialogue, Persona, Session, stable_id
from dualmem.stores.dual import DualStore
from dualmem.stores.langgraph_store import LanceDBStore
from dualmem.writer.chunking import Chunk, as_sessions, chunk_sessions
from dualmem.writer.nodes import WriteInput, WriteReport, WriteState, failed_rows, prepare, route, settle, write

builder = StateGraph(WriteState, context_schema=Context, input_schema=WriteInput)
builder.add_node("prepare", prepare)
builder.add_node("write", write)
builder.add_node("settle", settle)
builder.add_edge(START, "prepare")
builder.add_conditional_edges("prepare", route, ["write", "settle", END])
builder.add_conditional_edges("write", route, ["write", "settle", END])
builder.add_edge("settle", END)
graph = builder.compile()
graph.name = "write"


# --------------------------------------------------------------------------- Python API

BATCH_CHUNKS = 8


@dataclass
class _Job:
    persona: dict[str, Any]
    context: Context
    store: DualStore
    chunks: list[Chunk]
    namespace: tuple[str, ...]
    thread_id: str
    checkpoint_path: str | None
    checkpointer: Any
    progress: bool = True
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # the report row of every chunk this call wrote

    def config(self) -> RunnableConfig:
        return RunnableConfig(configurable={"thread_id": self.thread_id}, recursion_limit=BATCH_CHUNKS + 16)

    def todo(self) -> list[Chunk]:
        """Return the chunks the ledger has not seen applied (new and failed ones)."""
        done = self.store.ledger.applied_ids(self.namespace)
        return [c for c in self.chunks if c["id"] not in done]

    def batches(self) -> Iterator[dict[str, Any]]:
        """Yield the inputs of the runs still to do, computed when the first is needed (after a resume)."""
        todo = self.todo()
        for i in range(0, len(todo), BATCH_CHUNKS):
            yield {"persona": self.persona, "namespace": list(self.namespace), "chunks": todo[i : i + BATCH_CHUNKS]}

    def report(self) -> WriteReport:
        """Return rows in chunk order; chunks this call did not write were applied before."""
        out = []
        for chunk in self.chunks:
            row = self.rows.get(chunk["id"])
            if row is None:
                row = {"chunk_id": chunk["id"], "index": chunk["index"], "session_id": chunk["session_id"], "turn_ids": chunk["turn_ids"], "status": "skipped", "attempts": 0}
            out.append(row)
        return WriteReport(self.namespace, self.thread_id, chunks=out, failed_chunks=failed_rows(out))

    @contextmanager
    def running(self) -> Iterator[dict[str, Any]]:
        """Show the progress bar while a run lasts; yield the runner's keyword arguments (its update hook fills ``rows``)."""
        bar = Progress(
            TextColumn("[bold]writing memory"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
            disable=not self.progress,
        )
        task = bar.add_task("write", total=len(self.todo()))

        def on_update(update: dict[str, Any]) -> None:
            for row in (update.get("write") or {}).get("report") or []:
                if row["status"] == "skipped" and row["chunk_id"] in self.rows:
                    continue  # written earlier in this call (the resumed part of an interrupted run)
                self.rows[row["chunk_id"]] = row
                bar.advance(task)

        with bar:
            yield {
                "context": self.context, "store": LanceDBStore.over(self.store), "path": self.checkpoint_path,
                "checkpointer": self.checkpointer, "on_update": on_update,
            }  # fmt: skip


class WriteOptions(TypedDict, total=False):
    """Keyword options of :func:`write_history` and :func:`awrite_history` (all optional)."""

    settings: Settings | dict[str, Any] | None  # per-run settings (over the environment's)
    model: Any  # the writer model: a "provider:model" string or a model object
    store: DualStore | None  # default: the store ``settings`` names
    embeddings: Any
    namespace: Iterable[str] | None  # default: (persona id, user id)
    thread_id: str | None  # the checkpointed thread (default: one per namespace)
    progress: bool  # show a progress bar (default: True)
    checkpointer: Any  # None = SQLite at settings.checkpoint_path; False = none (the chunk ledger still makes re-runs idempotent); or a LangGraph saver


def _job(
    history: Dialogue | Session | Iterable[Session], persona: Persona | dict[str, Any] | None = None, *,
    settings: Settings | dict[str, Any] | None = None, model: Any = None, store: DualStore | None = None, embeddings: Any = None,
    namespace: Iterable[str] | None = None, thread_id: str | None = None, progress: bool = True, checkpointer: Any = None,
) -> _Job:
    """Prepare one write: its context, store, chunks and thread (the core both shells run)."""
    ctx = context_of(settings)
    if persona is None and isinstance(history, Dialogue):
        persona = history.persona
    if persona is None:
        raise ConfigurationError("write_history needs a persona: pass persona=Persona(...) (the writer writes through it)")
    who = persona if isinstance(persona, Persona) else Persona.model_validate(persona)
    if model is not None:
        from dualmem.models import load_chat_model

        ctx = ctx.with_(models={"writer": load_chat_model(model, ctx.settings, role="writer")})
    if embeddings is not None:
        ctx = ctx.with_(embeddings=embeddings)
    ns = tuple(namespace) if namespace else (who.id, ctx.user_id)
    chunks = chunk_sessions(as_sessions(history), ns, ctx.chunk_tokens)
    db = store if store is not None else DualStore.from_settings(ctx.settings, embeddings)
    path = ctx.checkpoint_path if checkpointer is None else None
    check_file_path(path or "")  # creates its folder, or says why it cannot
    if needs_check(ctx.writer if model is None else ctx.llm("writer")):  # one cheap call now, not a failure per chunk later
        check_model(ctx.llm("writer"), ctx.settings)
    thread = thread_id or stable_id("write", *ns, prefix="write-")
    return _Job(who.model_dump(mode="json"), ctx, db, chunks, ns, thread, path, checkpointer, progress)


def write_history(
    history: Dialogue | Session | Iterable[Session], persona: Persona | dict[str, Any] | None = None, **options: Unpack[WriteOptions]
) -> WriteReport:
    """Write a history into memory through ``persona``; resumable, and re-running retries failed chunks (see :class:`WriteOptions`)."""
    job = _job(history, persona, **options)
    with job.running() as run_kwargs:
        run_resumable(builder, job.batches(), job.config(), **run_kwargs)
    return job.report()


async def awrite_history(
    history: Dialogue | Session | Iterable[Session], persona: Persona | dict[str, Any] | None = None, **options: Unpack[WriteOptions]
) -> WriteReport:
    """Async :func:`write_history` (same graph and nodes, async SQLite checkpointer)."""
    job = _job(history, persona, **options)
    with job.running() as run_kwargs:
        await arun_resumable(builder, job.batches(), job.config(), **run_kwargs)
    return job.report()


def retry_failed(
    history: Dialogue | Session | Iterable[Session], persona: Persona | dict[str, Any] | None = None, **options: Unpack[WriteOptions]
) -> WriteReport:
    """Redo the chunks not applied yet (failed ones) of a history; applied chunks are skipped, not re-asked."""
    return write_history(history, persona, **options)
