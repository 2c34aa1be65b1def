"""Write a whole history into memory: the writer's core over its chunks, one after the other, resumable by the ledger.

:func:`write_history` cuts the history into chunks and writes them one after the
other while holding the namespace once (:func:`~dualmem.writer.core.writing`: one
lease, two commits per chunk): a chunk applied before (by this or any other
process) is skipped, a plan left pending by a killed writer is
applied, a failed chunk is reported and asked again when the call is repeated.
Nothing else keeps state between calls: running it again after a crash, from
any process, finishes the history, and the memory equals the one an
uninterrupted run writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from typing_extensions import TypedDict, Unpack

from dualmem.config import Settings
from dualmem.context import Context, context_of
from dualmem.errors import ConfigurationError
from dualmem.memory.chunking import Chunk, as_sessions, chunk_sessions
from dualmem.preflight import check_model, needs_check
from dualmem.retrieval.snapshot import Snapshots
from dualmem.schema import Dialogue, Persona, Session
from dualmem.stores import dual_of, open_store
from dualmem.stores.contract import DualStore
from dualmem.writer.core import writing
from dualmem.writer.report import WriteReport, failed_rows


class WriteOptions(TypedDict, total=False):
    """Keyword options of :func:`write_history` and :func:`awrite_history` (all optional)."""

    settings: Settings | dict[str, Any] | None  # per-run settings (over the environment's)
    model: Any  # the writer model: a "provider:model" string or a model object
    store: Any  # a DualStore or LanceDBStore; default: the store ``settings`` names
    embeddings: Any
    namespace: Iterable[str] | None  # default: (persona id, user id)
    progress: bool  # show a progress bar (default: True)


def _context(settings: Settings | dict[str, Any] | None, model: Any, embeddings: Any) -> Context:
    ctx = context_of(settings)
    if model is not None:
        from dualmem.models import load_chat_model

        ctx = ctx.with_(models={"writer": load_chat_model(model, ctx.settings, role="writer")})
    if embeddings is not None:
        ctx = ctx.with_(embeddings=embeddings)
    return ctx


def _persona(history: Any, persona: Persona | dict[str, Any] | None) -> Persona:
    if persona is None and isinstance(history, Dialogue):
        persona = history.persona
    if persona is None:
        raise ConfigurationError(
            "write_history needs a persona: pass persona=Persona(...) (the writer writes through it)"
        )
    return persona if isinstance(persona, Persona) else Persona.model_validate(persona)


def write_history(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None = None,
    **options: Unpack[WriteOptions],
) -> WriteReport:
    """Write a history into memory through ``persona``, chunk by chunk, exactly once; re-running it resumes a killed
    run and retries failed chunks (see :class:`WriteOptions`). Returns one report row per chunk."""
    who = _persona(history, persona)
    ctx = _context(options.get("settings"), options.get("model"), options.get("embeddings"))
    own_user = history.user_id if isinstance(history, Dialogue) and history.user_id not in ("", "user") else None
    user = own_user or ctx.settings.user  # the dialogue's own user (as `dualmem ingest` takes it), else the settings'
    ns = tuple(options.get("namespace") or (who.id, user))
    chunks = chunk_sessions(as_sessions(history), ns, ctx.settings.tuning.chunk_tokens)
    given = options.get("store")
    store: DualStore = dual_of(given) if given is not None else open_store(ctx.settings, options.get("embeddings"))
    if needs_check(
        ctx.settings.writer if options.get("model") is None else ctx.llm("writer")
    ):  # one cheap call, not a failure per chunk
        check_model(ctx.llm("writer"), ctx.settings)
    rows, waited = _write(ctx, store, ns, who, chunks, options.get("progress", True))
    return WriteReport(ns, chunks=rows, failed_chunks=failed_rows(rows), lease_wait_s=round(waited, 3))


def _write(
    ctx: Context, store: DualStore, ns: tuple[str, ...], persona: Persona, chunks: list[Chunk], progress: bool
) -> tuple[list[dict[str, Any]], float]:
    """Write each chunk the ledger has not seen applied, showing progress; return a row per chunk in order and the
    seconds spent waiting for other writers of the namespace."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    done = store.ledger.applied_ids(ns)
    todo = [c for c in chunks if c["id"] not in done]
    rows: dict[str, dict[str, Any]] = {}
    snapshots = Snapshots()
    bar = Progress(
        TextColumn("[bold]writing memory"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("chunks"),
        TimeElapsedColumn(),
        disable=not progress or not todo,
    )
    waited, asked = 0.0, time.monotonic()
    if todo:
        with bar, writing(store, ns, give_up=lambda: {c["id"] for c in todo} <= store.ledger.applied_ids(ns)) as held:
            # None: another writer did our chunks while we waited; a store written against 0.4.0 has no waited_s
            waited = getattr(held.lease, "waited_s", 0.0) if held is not None else time.monotonic() - asked
            task = bar.add_task("write", total=len(todo))
            for chunk in todo if held is not None else []:  # None: another writer wrote them while we waited
                rows[chunk["id"]] = dict(held.write(ctx, persona, chunk, snapshots=snapshots))  # type: ignore[union-attr]
                bar.advance(task)
    skipped = {"status": "skipped", "attempts": 0}
    out = [
        rows.get(c["id"])
        or {
            "chunk_id": c["id"],
            "index": c["index"],
            "session_id": c["session_id"],
            "turn_ids": c["turn_ids"],
            **skipped,
        }
        for c in chunks
    ]
    return out, waited


async def awrite_history(
    history: Dialogue | Session | Iterable[Session],
    persona: Persona | dict[str, Any] | None = None,
    **options: Unpack[WriteOptions],
) -> WriteReport:
    """Async :func:`write_history` (the same loop, in a worker thread)."""
    return await asyncio.to_thread(write_history, history, persona, **options)
