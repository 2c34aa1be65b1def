"""Respond core: dual-stream retrieval, the reply prompt, online memory write-back.

Retrieved items travel through graph state as plain dicts
(``{"item": MemoryItem JSON, "score": float}``) and come back as
:class:`~dualmem.stores.dual.ScoredItem` for display.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from dualmem.config import Settings
from dualmem.nodes.chunking import chunk_sessions
from dualmem.nodes.writer import ChunkRow, WriterResources, write_chunk
from dualmem.prompts.respond import format_dual_memory, render_respond_messages
from dualmem.retrieval.pipeline import Ranker
from dualmem.schema import MemoryItem, Persona, Session, Turn, stable_id, utcnow
from dualmem.stores.dual import DualResult, DualStore, Namespace, ScoredItem


def retrieve_memory(
    store: DualStore,
    namespace: Namespace,
    query: str,
    *,
    k: int = 10,
    mode: str = "dual",
    ranker: Ranker | None = None,
    context: Sequence[Any] | None = None,
) -> DualResult:
    """Return ``k`` facts and ``k`` insights (``mode="dual"``) or one top-``k`` pool (``"merged"``), ranked by
    ``ranker`` (default: the learned one) after the conversation ``context``; insights come with their cited facts."""
    if mode not in ("dual", "merged"):
        raise ValueError(f"retrieval mode {mode!r}: use dual or merged")
    ranker = ranker or Ranker()
    if mode == "merged":
        pool = ranker.rank(store, namespace, query, k, context=context)
        result = DualResult(merged=pool, facts=[h for h in pool if h.item.kind == "fact"],
                            insights=[h for h in pool if h.item.kind == "insight"])
    else:
        per_kind = ranker.rank_kinds(store, namespace, query, k, context=context)
        result = DualResult(facts=per_kind["fact"], insights=per_kind["insight"])
    if result.insights:
        result.grounding = store.grounding(namespace, [h.item for h in result.insights])
    return result


def emotion_rerank(
    store: DualStore,
    namespace: Namespace,
    query: str,
    *,
    strategy: str,
    model: BaseChatModel,
    embeddings: Embeddings,
    k: int = 10,
    mode: str = "dual",
    search_mode: str = "hybrid",
    retries: int = 2,
    policy: Any = None,
) -> DualResult:
    """Retrieve a pool per stream, then rank it by meaning and emotion (Emotional RAG's C-A/C-M/S-S/S-E).

    Items written without an emotion vector count as emotionally neutral (similarity 0);
    when the query's emotion cannot be scored the ranking falls back to meaning.
    """
    from dualmem.nodes.emotion import DEFAULT_POOL, check_strategy, rerank, score_emotion

    check_strategy(strategy)
    if store.count(namespace) == 0:
        return DualResult()
    size = max(DEFAULT_POOL, k)
    pool = store.dual_search(namespace, query, k_facts=size, k_insights=size, mode=search_mode, expand=True)  # type: ignore[arg-type]
    scored = score_emotion(model, query, retries=retries, policy=policy)
    q_emotion = scored.value.vector() if scored.value is not None else None
    q_vector = embeddings.embed_query(query)

    def ranked(hits: Sequence[ScoredItem]) -> list[ScoredItem]:
        if not hits:
            return []
        vectors = embeddings.embed_documents([h.item.text for h in hits])
        order = rerank(strategy, q_vector, q_emotion, vectors, [h.item.emotion for h in hits], k=k)
        return [ScoredItem(hits[i].item, score) for i, score in order]

    if mode == "merged":
        merged = ranked([*pool.facts, *pool.insights])
        facts = [h for h in merged if h.item.kind == "fact"]
        insights = [h for h in merged if h.item.kind == "insight"]
    else:
        merged, facts, insights = [], ranked(pool.facts), ranked(pool.insights)
    grounding = {h.item.id: pool.grounding.get(h.item.id, []) for h in insights}
    return DualResult(facts=facts, insights=insights, grounding=grounding, merged=merged)


def recall_memory(
    res: WriterResources, namespace: Namespace, query: str, *, k: int, mode: str,
    context: Sequence[Any] | None = None, ranker: Ranker | None = None,
) -> DualResult:
    """Retrieve with the settings' ranker (or ``ranker``), emotion-aware when ``emotion_strategy`` is set."""
    s = res.settings
    if s.emotion_strategy:
        return emotion_rerank(
            res.db(), namespace, query, strategy=s.emotion_strategy, model=res.chat(), embeddings=res.embedder(),
            k=k, mode=mode, search_mode=s.search_mode, retries=s.max_retries, policy=s,
        )
    return retrieve_memory(res.db(), namespace, query, k=k, mode=mode, ranker=ranker or Ranker.from_settings(s), context=context)


def dump_hits(hits: Sequence[ScoredItem]) -> list[dict[str, Any]]:
    """Return hits as plain dicts for graph state."""
    return [{"item": h.item.model_dump(mode="json"), "score": float(h.score)} for h in hits]


def load_hits(rows: Sequence[dict[str, Any]] | None) -> list[ScoredItem]:
    """Return hits from their state dicts."""
    return [ScoredItem(MemoryItem.model_validate(r["item"]), float(r["score"])) for r in rows or []]


def result_to_state(result: DualResult) -> dict[str, Any]:
    """Return a retrieval result as state updates."""
    return {
        "facts": dump_hits(result.facts),
        "insights": dump_hits(result.insights),
        "merged": dump_hits(result.merged),
        "grounding": {iid: [f.model_dump(mode="json") for f in facts] for iid, facts in result.grounding.items()},
    }


def result_from_state(state: dict[str, Any]) -> DualResult:
    """Return the retrieval result held in a respond state."""
    return DualResult(
        facts=load_hits(state.get("facts")),
        insights=load_hits(state.get("insights")),
        merged=load_hits(state.get("merged")),
        grounding={iid: [MemoryItem.model_validate(f) for f in facts] for iid, facts in (state.get("grounding") or {}).items()},
    )


def memory_text(result: DualResult) -> str:
    """Render a retrieval result for the reply prompt (insights with their facts)."""
    return format_dual_memory([h.item for h in result.facts], [h.item for h in result.insights], result.grounding)


def reply_messages(persona: Persona | None, result: DualResult, query: str, history: Sequence[Any] | None = None) -> list[BaseMessage]:
    """Return the in-character reply prompt for ``query`` with the retrieved memory."""
    return render_respond_messages(persona, memory_text(result), query, history)


def message_text(message: Any) -> str:
    """Return the text of a model answer (string content or content blocks)."""
    content = getattr(message, "content", message)
    if isinstance(content, list):
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content).strip()
    return str(content).strip()


def exchange_session(persona: Persona, query: str, reply: str, when: str | None = None) -> Session:
    """Return one chat exchange as a session (unique id per exchange)."""
    stamp = utcnow()
    sid = stable_id("chat", persona.id, query, reply, stamp.isoformat(), prefix="chat-")
    return Session(
        id=sid,
        time=when or stamp.date().isoformat(),
        turns=[
            Turn(id=f"{sid}-u", role="user", text=query),
            Turn(id=f"{sid}-a", role="assistant", speaker=persona.name, text=reply),
        ],
    )


def remember_exchange(
    res: WriterResources, namespace: Namespace, persona: Persona, query: str, reply: str, earlier: Sequence[str] = ()
) -> list[ChunkRow]:
    """Write one exchange back into memory through the writer (online memory).

    ``earlier``: the user's previous messages of this chat, read by the
    memory-poisoning guard only (a request announced there flags this message).
    """
    settings: Settings = res.settings
    session = exchange_session(persona, query, reply)
    context = [Turn(id=f"earlier-{i}", role="user", text=text) for i, text in enumerate(earlier)]
    writer = res.for_writing()
    chunks = chunk_sessions([session], namespace, settings.chunk_tokens, context=context)
    return [write_chunk(writer, namespace, persona, chunk) for chunk in chunks]
