"""The writer's per-chunk core: recall the view, ask the persona, validate, apply — exactly once.

:func:`write_chunk` does one chunk under the namespace's write lease
(:mod:`dualmem.stores.leases`), so one writer at a time, in any process,
works on a namespace and the working view a chunk is drafted against holds
every chunk applied before it. The validated plan is stored in the chunk
ledger as *pending* before any of it is written, and whoever holds the lease
applies every pending plan first (deterministic ids, idempotent upserts): a
writer killed between drafting and applying loses nothing, and no chunk is
asked or applied twice. (Async graph runs call these sync functions in a
worker thread.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.messages import BaseMessage
from typing_extensions import TypedDict

from dualmem.context import Context
from dualmem.prompts.writer import render_writer_messages
from dualmem.schema import MemoryItem, MemoryUpdate, Persona
from dualmem.stores.dual import DualStore, Namespace
from dualmem.structured import Structured, invoke_structured
from dualmem.tokens import count_tokens
from dualmem.writer.chunking import Chunk
from dualmem.writer.recall import View, recall_view, view_text
from dualmem.writer.update import Plan, plan_update


class MemoEmbeddings(Embeddings):
    """Remember document vectors by text, so a text is embedded once per run (dedup, then upsert)."""

    def __init__(self, base: Embeddings, size: int = 4096) -> None:
        self.base, self.size = base, size
        self.memo: dict[str, list[float]] = {}

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed the texts not seen yet; return every text's vector."""
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if missing:
            self.memo.update(zip(missing, self.base.embed_documents(missing), strict=True))
            for old in list(self.memo)[: max(0, len(self.memo) - self.size)]:
                if old not in missing:
                    del self.memo[old]
        return [self.memo[t] if t in self.memo else self.base.embed_documents([t])[0] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed a query (not remembered)."""
        return self.base.embed_query(text)


def store_embedder(ctx: Context, store: DualStore) -> MemoEmbeddings:
    """Return the store's embedder (vectors must match it), remembering document vectors for this context."""
    memo = ctx._built.get("memo")
    if not isinstance(memo, MemoEmbeddings) or memo.base is not store.embeddings:
        memo = ctx._built["memo"] = MemoEmbeddings(store.embeddings)
    return memo


class ChunkRow(TypedDict, total=False):
    """One line of the run report."""

    chunk_id: str
    index: int
    session_id: str
    turn_ids: list[str]
    status: str  # applied | failed | skipped
    prompt_tokens: int
    attempts: int
    applied: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    merged: list[dict[str, Any]]
    error: str | None
    raw: str | None
    emotion_failed: list[str]
    drafted_by: str
    flagged: list[dict[str, Any]]  # the guard's requests among the chunk's turns


def _row(chunk: Chunk, status: str, **extra: Any) -> ChunkRow:
    flagged = [dict(f) for f in chunk.get("flagged") or []]
    return ChunkRow(chunk_id=chunk["id"], index=chunk["index"], session_id=chunk["session_id"], turn_ids=list(chunk["turn_ids"]), status=status, flagged=flagged, **extra)  # type: ignore[typeddict-item]


def writer_messages(ctx: Context, store: DualStore, namespace: Namespace, persona: Persona, chunk: Chunk) -> tuple[list[BaseMessage], View]:
    """Recall the view for ``chunk`` and return the writer's messages with it."""
    view = recall_view(store, namespace, chunk["text"], k=ctx.view_k, recent=ctx.view_recent, mode=ctx.search_mode, embeddings=store_embedder(ctx, store))
    return render_writer_messages(persona, view_text(view), chunk["text"]), view


def prompt_tokens(messages: Sequence[BaseMessage]) -> int:
    """Return the token count of a rendered prompt."""
    return count_tokens("\n".join(str(m.content) for m in messages))


def plan_answer(ctx: Context, store: DualStore, namespace: Namespace, chunk: Chunk, view: View, tokens: int, out: Structured[MemoryUpdate]) -> tuple[ChunkRow, Plan | None]:
    """Validate the writer's answer into a plan; return its report row (``failed`` without a usable answer)."""
    if not out.ok or out.value is None:
        error = out.error if out.call_failed else f"no valid MemoryUpdate after {out.attempts} attempt(s): {out.error}"
        return _row(chunk, "failed", prompt_tokens=tokens, attempts=out.attempts, error=error, raw=(out.raw[-1] if out.raw else "")[:2000]), None
    plan = plan_update(out.value, view, chunk, namespace, embeddings=store_embedder(ctx, store), dedup_threshold=ctx.dedup_threshold, max_ops=ctx.max_ops_per_chunk)
    unscored = score_emotions(ctx, plan) if ctx.emotion_strategy else []
    row = _row(
        chunk, "planned", prompt_tokens=tokens, attempts=out.attempts, applied=plan["applied"], rejected=plan["rejected"],
        merged=plan["merged"], error=None, emotion_failed=unscored, drafted_by=uuid.uuid4().hex,
    )
    return row, plan


def score_emotions(ctx: Context, plan: Plan) -> list[str]:
    """Give the plan's new and rewritten items an 8-emotion vector (``emotion_strategy`` on).

    Returns the ids whose scoring failed after the repairs (kept without emotion, reported).
    """
    from dualmem.writer.emotion import score_emotion

    failed = []
    for row in plan["upserts"]:
        if row.get("status") != "active":
            continue
        out = score_emotion(ctx.llm("writer"), row["text"], retries=ctx.max_retries, policy=ctx)
        if out.value is None:
            failed.append(row["id"])
        else:
            row["emotion"] = out.value.vector()
    return failed


def apply_plan(store: DualStore, namespace: Namespace, plan: Plan, embeddings: Embeddings) -> None:
    """Write a plan's rows as given (last version of an id wins), then its supersedes (idempotent)."""
    rows = list({row["id"]: row for row in plan["upserts"]}.values())
    if rows:
        vectors = embeddings.embed_documents([r["text"] for r in rows])
        store.upsert([MemoryItem.model_validate(r) for r in rows], vectors=vectors, as_given=True)
    kinds = {rec["store_id"]: rec["stream"] for rec in plan["applied"] if rec["op"] == "DELETE" and rec.get("store_id")}
    by_kind: dict[str | None, list[str]] = {}
    for item_id in dict.fromkeys(plan["supersede"]):  # DELETEs: the applied record names the stream
        by_kind.setdefault(kinds.get(item_id), []).append(item_id)
    for kind, ids in by_kind.items():
        store.supersede(namespace, ids, kind=kind)  # type: ignore[arg-type]


def flush_pending(store: DualStore, namespace: Namespace, pending: Sequence[tuple[str, str]], embeddings: Embeddings, lease: Any) -> dict[str, Any]:
    """Apply the namespace's pending plans (this writer's or a dead one's); return chunk id -> its record.

    Call it while holding the namespace's write lease; ``lease.check()`` fences each commit.
    """
    done: dict[str, Any] = {}
    for chunk_id, payload in pending:
        record = json.loads(payload)
        plan: Plan = record["plan"]
        lease.check()
        apply_plan(store, namespace, plan, embeddings)
        summary = {"applied": plan["applied"], "merged": plan["merged"], "drafted_by": record.get("drafted_by")}
        store.ledger.mark(namespace, chunk_id, "applied", json.dumps(summary, default=str))
        done[chunk_id] = record
    return done


def write_chunk(ctx: Context, store: DualStore, namespace: Namespace, persona: Persona, chunk: Chunk, config: Any = None) -> ChunkRow:
    """Write one chunk exactly once, under the namespace's write lease; return its report row.

    ``skipped``: applied before (by any writer); ``applied``: written now (a plan left
    pending by a writer that died is applied, not asked again); ``failed``: no usable answer.
    """
    embeddings = store_embedder(ctx, store)
    with store.exclusive(namespace, give_up=lambda: store.ledger.applied(namespace, chunk["id"])) as lease:
        if lease is None:  # another writer applied this chunk while we waited for the namespace
            return _row(chunk, "skipped", attempts=0)
        state, pending = store.ledger.look(namespace, chunk["id"])
        recovered = flush_pending(store, namespace, pending, embeddings, lease)
        if chunk["id"] in recovered:
            plan = recovered[chunk["id"]]["plan"]
            return _row(chunk, "applied", attempts=0, applied=plan["applied"], rejected=plan["rejected"], merged=plan["merged"], recovered=True)
        if state is not None and state[0] == "applied":
            return _row(chunk, "skipped", attempts=0)
        messages, view = writer_messages(ctx, store, namespace, persona, chunk)
        out = invoke_structured(ctx.llm("writer"), messages, MemoryUpdate, retries=ctx.max_retries, config=config, policy=ctx)
        row, plan = plan_answer(ctx, store, namespace, chunk, view, prompt_tokens(messages), out)
        if plan is None:
            return row
        payload = json.dumps({"plan": plan, "drafted_by": row["drafted_by"]}, default=str)
        lease.check()
        store.ledger.mark(namespace, chunk["id"], "pending", payload, new=state is None)  # from here on, a crash loses nothing
        flush_pending(store, namespace, [(chunk["id"], payload)], embeddings, lease)
    row["status"] = "applied"
    return row
