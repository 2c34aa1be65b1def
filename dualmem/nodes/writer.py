"""The writer's per-chunk core: recall the view, ask the persona, validate, apply — exactly once.

``draft`` (recall + model + validation) and ``apply`` are separate steps. Both
run under the namespace's write lease (:mod:`dualmem.stores.leases`), so one
writer at a time, in any process, works on a namespace: the working view a
chunk is drafted against holds every chunk applied before it. The drafted plan
is stored in the chunk ledger as *pending* before the lease is given back, and
whoever holds the lease next applies every pending plan first (deterministic
ids, idempotent upserts) — a writer killed between drafting and applying loses
nothing and no chunk is asked or applied twice. (Async graph runs call these
sync nodes in a worker thread.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from typing_extensions import TypedDict

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.models import load_chat_model, load_embeddings
from dualmem.nodes.chunking import Chunk
from dualmem.nodes.recall import View, recall_view, view_text
from dualmem.nodes.update import Plan, plan_update
from dualmem.prompts.writer import render_writer_messages
from dualmem.schema import MemoryItem, MemoryUpdate, Persona
from dualmem.stores.dual import DualStore, Namespace
from dualmem.structured import Structured, invoke_structured
from dualmem.tokens import count_tokens

_TYPES = {"str": str, "int": int, "float": float, "bool": bool}

# The graphs' context schema: every Settings field, all optional (``langgraph dev``
# and Studio pass a dict; pydantic cannot build a schema of the Settings dataclass).
SettingsContext = TypedDict(  # type: ignore[misc]
    "SettingsContext", {f.name: _TYPES.get(str(f.type), str) for f in fields(Settings)}, total=False
)

def dual_store(store: Any) -> DualStore | None:
    """Return the ``DualStore`` behind a graph's store (a ``LanceDBStore`` or a ``DualStore``), None for none."""
    if store is None or isinstance(store, DualStore):
        return store
    from dualmem.stores.langgraph_store import LanceDBStore

    if isinstance(store, LanceDBStore):
        return store.dual
    raise ConfigurationError(
        f"the DualMem graphs need a LanceDB store, got {type(store).__name__}; compile with "
        "store=LanceDBStore.from_settings(...) or serve with the store of langgraph.json"
    )


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


@dataclass
class WriterResources:
    """What the writer and responder nodes use: settings plus optional injected objects."""

    settings: Settings
    model: BaseChatModel | None = None
    store: DualStore | None = None
    embeddings: Embeddings | None = None
    role: str = "writer"
    writer_model: BaseChatModel | None = None
    formation: Any = None  # where chat exchanges are formed into memory (a dualmem.chat Formation); None = by settings
    _memo: MemoEmbeddings | None = field(default=None, repr=False)

    def chat(self) -> BaseChatModel:
        """Return the injected model or the one named by the settings for ``role``."""
        if self.model is None:
            self.model = load_chat_model(None, self.settings, role=self.role)
        return self.model

    def db(self) -> DualStore:
        """Return the injected store (the graph's ``runtime.store`` or the caller's); never opens one itself."""
        if self.store is None:
            raise ConfigurationError(
                "no memory store: run the graph with a store (graph.compile(store=LanceDBStore.from_settings()), "
                "langgraph.json's store on the server) or pass store= to the Python API"
            )
        return self.store

    def for_writing(self) -> WriterResources:
        """Return resources for the writer role (online memory from the responder).

        An injected chat model also writes unless ``writer_model`` is given or
        ``settings.writer_model`` names another model.
        """
        if self.role == "writer":
            return self
        model = self.writer_model or (None if self.settings.writer_model else self.model)
        return WriterResources(self.settings, model=model, store=self.db(), embeddings=self.embeddings, role="writer")

    def embedder(self) -> Embeddings:
        """Return the store's embedder (vectors must match it), else the injected or the settings' one."""
        store_embeddings = getattr(self.db(), "embeddings", None)
        base = store_embeddings or self.embeddings or load_embeddings(None, self.settings)
        if not isinstance(self._memo, MemoEmbeddings) or self._memo.base is not base:
            self._memo = MemoEmbeddings(base)
        return self._memo


def resources(runtime: Any, role: str = "writer") -> WriterResources:
    """Return resources from a graph runtime (its context and ``runtime.store``) or from a bare context."""
    context = getattr(runtime, "context", runtime)
    store = dual_store(getattr(runtime, "store", None))
    if isinstance(context, WriterResources):
        if context.store is None and store is not None:
            context.store = store
        return context
    if context is None or isinstance(context, (Settings, dict)):
        return WriterResources(settings=Settings.resolve(context), role=role, store=store)
    raise ConfigurationError(
        f"graph context must be Settings, a dict of settings or WriterResources, got {type(context).__name__}"
    )


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


class Draft(TypedDict):
    """A chunk's drafted plan (or why there is none), checkpointed before applying."""

    row: ChunkRow
    plan: Plan | None


def _row(chunk: Chunk, status: str, **extra: Any) -> ChunkRow:
    flagged = [dict(f) for f in chunk.get("flagged") or []]
    return ChunkRow(chunk_id=chunk["id"], index=chunk["index"], session_id=chunk["session_id"], turn_ids=list(chunk["turn_ids"]), status=status, flagged=flagged, **extra)  # type: ignore[typeddict-item]


def writer_messages(res: WriterResources, namespace: Namespace, persona: Persona, chunk: Chunk) -> tuple[list[BaseMessage], View]:
    """Recall the view for ``chunk`` and return the writer's messages with it."""
    s = res.settings
    view = recall_view(res.db(), namespace, chunk["text"], k=s.view_k, recent=s.view_recent, mode=s.search_mode, embeddings=res.embedder())
    return render_writer_messages(persona, view_text(view), chunk["text"]), view


def prompt_tokens(messages: Sequence[BaseMessage]) -> int:
    """Return the token count of a rendered prompt."""
    return count_tokens("\n".join(str(m.content) for m in messages))


def _finish(res: WriterResources, namespace: Namespace, chunk: Chunk, view: View, tokens: int, out: Structured[MemoryUpdate]) -> Draft:
    if not out.ok or out.value is None:
        error = out.error if out.call_failed else f"no valid MemoryUpdate after {out.attempts} attempt(s): {out.error}"
        row = _row(chunk, "failed", prompt_tokens=tokens, attempts=out.attempts, error=error, raw=(out.raw[-1] if out.raw else "")[:2000])
        return Draft(row=row, plan=None)
    s = res.settings
    plan = plan_update(out.value, view, chunk, namespace, embeddings=res.embedder(), dedup_threshold=s.dedup_threshold, max_ops=s.max_ops_per_chunk)
    unscored = score_emotions(res, plan) if res.settings.emotion_strategy else []
    row = _row(
        chunk, "planned", prompt_tokens=tokens, attempts=out.attempts, applied=plan["applied"], rejected=plan["rejected"],
        merged=plan["merged"], error=None, emotion_failed=unscored, drafted_by=uuid.uuid4().hex,
    )
    return Draft(row=row, plan=plan)


def score_emotions(res: WriterResources, plan: Plan) -> list[str]:
    """Give the plan's new and rewritten items an 8-emotion vector (``emotion_strategy`` on).

    Returns the ids whose scoring failed after the repairs (kept without emotion, reported).
    """
    from dualmem.nodes.emotion import score_emotion

    failed = []
    for row in plan["upserts"]:
        if row.get("status") != "active":
            continue
        out = score_emotion(res.chat(), row["text"], retries=res.settings.max_retries, policy=res.settings)
        if out.value is None:
            failed.append(row["id"])
        else:
            row["emotion"] = out.value.vector()
    return failed


def draft_chunk(res: WriterResources, namespace: Namespace, persona: Persona, chunk: Chunk, config: Any = None) -> Draft:
    """Draft one chunk's plan under the namespace's write lease and store it as pending (skipped if applied)."""
    store = res.db()
    with store.exclusive(namespace, give_up=lambda: store.ledger.applied(namespace, chunk["id"])) as lease:
        if lease is None:  # another writer applied this chunk while we waited for the namespace
            return Draft(row=_row(chunk, "skipped", attempts=0), plan=None)
        flush_pending(store, namespace, res.embedder(), lease)
        if store.ledger.applied(namespace, chunk["id"]):
            return Draft(row=_row(chunk, "skipped", attempts=0), plan=None)
        messages, view = writer_messages(res, namespace, persona, chunk)
        out = invoke_structured(res.chat(), messages, MemoryUpdate, retries=res.settings.max_retries, config=config, policy=res.settings)
        draft = _finish(res, namespace, chunk, view, prompt_tokens(messages), out)
        if draft["plan"] is not None:
            lease.check()
            store.ledger.mark(namespace, chunk["id"], "pending", _pending_payload(draft))
        return draft


def _pending_payload(draft: Draft) -> str:
    return json.dumps({"plan": draft["plan"], "drafted_by": draft["row"].get("drafted_by")}, default=str)


def apply_plan(store: DualStore, namespace: Namespace, plan: Plan, embeddings: Embeddings | None = None) -> None:
    """Write a plan's rows: upserts (last version of an id wins), then supersedes (idempotent)."""
    rows = list({row["id"]: row for row in plan["upserts"]}.values())
    if rows:
        vectors = embeddings.embed_documents([r["text"] for r in rows]) if embeddings is not None else None
        store.upsert([MemoryItem.model_validate(r) for r in rows], vectors=vectors)
    if plan["supersede"]:
        store.supersede(namespace, list(dict.fromkeys(plan["supersede"])))


def flush_pending(store: DualStore, namespace: Namespace, embeddings: Embeddings | None, lease: Any) -> dict[str, str | None]:
    """Apply every pending plan of ``namespace`` (this writer's or a dead one's); return chunk id -> drafter.

    Call it while holding the namespace's write lease; ``lease.check()`` fences each commit.
    """
    done: dict[str, str | None] = {}
    for chunk_id, payload in store.ledger.pending(namespace):
        record = json.loads(payload)
        plan: Plan = record["plan"]
        lease.check()
        apply_plan(store, namespace, plan, embeddings)
        summary = {"applied": plan["applied"], "merged": plan["merged"], "drafted_by": record.get("drafted_by")}
        store.ledger.mark(namespace, chunk_id, "applied", json.dumps(summary, default=str))
        done[chunk_id] = record.get("drafted_by")
    return done


def apply_draft(res: WriterResources, namespace: Namespace, draft: Draft) -> ChunkRow:
    """Apply a drafted plan once (under the lease) and return the final report row.

    ``applied`` when this draft's plan is in memory now (applied here or by the writer
    that took the lease in between), ``skipped`` when another writer's plan was used.
    """
    row = dict(draft["row"])
    if draft["plan"] is None:
        return ChunkRow(**row)  # type: ignore[typeddict-item]
    store, chunk_id = res.db(), str(row["chunk_id"])
    # waiting ends early when the writer holding the namespace applied the chunk (our pending plan)
    with store.exclusive(namespace, give_up=lambda: store.ledger.applied(namespace, chunk_id)) as lease:
        if lease is not None:
            if store.ledger.get(namespace, chunk_id) is None:  # drafted before a reset of the ledger: keep our plan
                store.ledger.mark(namespace, chunk_id, "pending", _pending_payload(draft))
            flush_pending(store, namespace, res.embedder(), lease)
    state = store.ledger.get(namespace, chunk_id)
    drafter = json.loads(state[1]).get("drafted_by") if state and state[1] else None
    row["status"] = "applied" if drafter is not None and drafter == row.get("drafted_by") else "skipped"
    return ChunkRow(**row)  # type: ignore[typeddict-item]


def write_chunk(res: WriterResources, namespace: Namespace, persona: Persona, chunk: Chunk) -> ChunkRow:
    """Draft and apply one chunk without a checkpointer (online memory, small jobs)."""
    return apply_draft(res, namespace, draft_chunk(res, namespace, persona, chunk))
