"""``memagent``: MemAgent-style recurrent memory (arXiv 2507.02259), query-agnostic.

The history is read in chunks of ``settings.chunk_tokens`` tokens (cut at turn
boundaries; an over-long turn is split). After **every** chunk the model
rewrites one free-text memory of at most ``memory_tokens`` tokens (default
1,024): a longer answer is re-asked to be shortened (``settings.max_retries``
times), then cut to the budget, so the stored memory never exceeds it.

Choice (differs from the paper, which reads the history *with* the question):
ingest is incremental and query-agnostic, so one memory serves every question.
``retrieve(query, k)`` ranks the memory's lines by embedding similarity to the
query (no model call), each line citing as its source session the session whose
chunk first wrote it (a line kept word for word keeps its source; a reworded
line is new); ``respond(query)`` first runs one question-conditioned
pass over the memory (``MEMAGENT_FOCUS``), then answers from that focused memory
with the shared reader.

State (memory text, version, line sources, chunk ledger) lives in a LanceDB table under
``{uri}/memagent``, so ingest resumes after a restart without re-reading chunks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.full_context import LanceState, render_turn, session_chunks, truncate_tokens
from dualmem.prompts.memagent import MEMAGENT_FOCUS, MEMAGENT_SHORTEN, MEMAGENT_SYSTEM, MEMAGENT_UPDATE
from dualmem.retry import invoke_with_retry
from dualmem.schema import Session, stable_id
from dualmem.tokens import count_tokens

DEFAULT_MEMORY_TOKENS = 1024
MEMORY_KEY = "memory"


def _text(message: object) -> str:
    content = getattr(message, "content", message)
    if isinstance(content, list):
        content = " ".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    text = str(content).strip()
    for tag in ("<memory>", "</memory>"):
        text = text.replace(tag, "")
    return text.strip()


def _lines(memory: str) -> list[str]:
    return [ln.strip() for ln in memory.splitlines() if ln.strip()]


def line_sources(memory: str, earlier: dict[str, str], session_id: str) -> dict[str, str]:
    """Return the source session of each line of ``memory``: kept lines keep theirs, new lines get ``session_id``."""
    return {line: earlier.get(line, session_id) for line in _lines(memory)}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


class MemAgentFramework(MemoryFramework):
    """Rewrite one bounded free-text memory after every chunk of the history."""

    name = "memagent"
    description = "MemAgent-style recurrent memory: one free-text memory (<=1,024 tokens) rewritten after every chunk"

    def __init__(
        self, context: FrameworkContext, memory_tokens: int = DEFAULT_MEMORY_TOKENS, question_pass: bool = True
    ) -> None:
        super().__init__(context)
        self.memory_tokens = memory_tokens
        self.question_pass = question_pass
        self.namespace = tuple(context.namespace)
        self.state = LanceState(f"{context.uri}/{self.name}")
        self._line_cache: tuple[list[str], list[list[float]]] = ([], [])

    # ------------------------------------------------------------------ memory

    @property
    def memory(self) -> str:
        """Return the current memory text."""
        return (self.state.get(self.namespace, MEMORY_KEY) or {}).get("text", "")

    @property
    def version(self) -> int:
        """Return how many chunks have rewritten the memory so far."""
        return (self.state.get(self.namespace, MEMORY_KEY) or {}).get("version", 0)

    def _ask(self, messages: list[BaseMessage]) -> str:
        return _text(invoke_with_retry(self.context.chat(), messages, policy=self.context.settings))

    def _bounded(self, messages: list[BaseMessage], answer: str, stats: dict[str, int]) -> tuple[str, int]:
        """Return (answer within budget, model calls made): re-ask to shorten, then cut."""
        calls = 0
        for _ in range(self.context.settings.max_retries):
            tokens = count_tokens(answer)
            if tokens <= self.memory_tokens:
                return answer, calls
            stats["reasked"] += 1
            messages = [
                *messages,
                AIMessage(content=answer),
                HumanMessage(content=MEMAGENT_SHORTEN.format(tokens=tokens, budget=self.memory_tokens)),
            ]
            calls += 1
            shorter = self._ask(messages)
            answer = shorter or answer
        if count_tokens(answer) > self.memory_tokens:
            stats["truncated"] += 1
            answer = truncate_tokens(answer, self.memory_tokens)
        return answer, calls

    def rewrite(self, memory: str, chunk: str, stats: dict[str, int]) -> tuple[str, int]:
        """Return (the memory rewritten with ``chunk``, model calls made); raise if the model fails."""
        messages: list[BaseMessage] = [
            SystemMessage(content=MEMAGENT_SYSTEM),
            HumanMessage(content=MEMAGENT_UPDATE.format(memory=memory, chunk=chunk, budget=self.memory_tokens)),
        ]
        answer = self._ask(messages)
        if not answer:
            raise ValueError("the model returned an empty memory")
        bounded, calls = self._bounded(messages, answer, stats)
        return bounded, calls + 1

    # ------------------------------------------------------------------ interface

    def ingest(self, session: Session) -> IngestReport:
        """Read the session chunk by chunk, rewriting the memory after each chunk."""
        from rich.progress import Progress

        report = IngestReport(session_id=session.id)
        stats = {"reasked": 0, "truncated": 0, "skipped": 0}
        chunks = session_chunks(session, self.context.settings.chunk_tokens)
        with Progress(transient=True, disable=len(chunks) < 4) as progress:
            task = progress.add_task(f"memagent {session.id}", total=len(chunks))
            for index, turns in enumerate(chunks):
                chunk_id = stable_id(*self.namespace, session.id, index, turns[0].id, turns[-1].id, prefix="c")
                progress.advance(task)
                if self.state.get(self.namespace, f"chunk:{chunk_id}") is not None:
                    stats["skipped"] += 1
                    continue
                current = self.state.get(self.namespace, MEMORY_KEY) or {"text": "", "version": 0}
                text = "\n".join(render_turn(t, session.time) for t in turns)
                try:
                    memory, calls = self.rewrite(current["text"], text, stats)
                except ConfigurationError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any model failure is recorded, never dropped
                    report.llm_calls += 1
                    report.failed_chunks.append(chunk_id)
                    report.meta.setdefault("errors", {})[chunk_id] = " ".join(str(exc).split())[:300]
                    continue
                report.llm_calls += calls
                earlier = current.get("sources")
                if earlier is None:  # state written before line sources: its lines come from its last session at best
                    earlier = {line: current.get("session_id") or session.id for line in _lines(current["text"])}
                sources = line_sources(memory, earlier, session.id)
                new = {"text": memory, "version": current["version"] + 1, "session_id": session.id, "sources": sources}
                self.state.put(self.namespace, {MEMORY_KEY: new, f"chunk:{chunk_id}": {"session_id": session.id}})
                report.items_written += 1
        report.meta.update(stats, memory_tokens=count_tokens(self.memory), version=self.version)
        return report

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` memory lines most similar to ``query``, best first."""
        state = self.state.get(self.namespace, MEMORY_KEY) or {}
        lines = _lines(state.get("text", ""))
        sources: dict[str, str] = state.get("sources") or {}
        if not lines:
            return []
        embedder = self.context.embedder()
        if self._line_cache[0] != lines:  # the memory changes only on ingest: embed its lines once
            self._line_cache = (lines, embedder.embed_documents(lines))
        vectors = self._line_cache[1]
        q = embedder.embed_query(query)
        scored = sorted(((_cosine(q, v), i) for i, v in enumerate(vectors)), key=lambda p: (-p[0], p[1]))
        version = state.get("version", 0)
        return [
            RetrievedItem(
                text=lines[i],
                kind="fact",
                score=s,
                source_session=sources.get(lines[i]),
                id=f"line{i}",
                meta={"unit": "memory-line", "version": version},
            )
            for s, i in scored[:k]
        ]

    def focus(self, question: str) -> str:
        """Return the memory rewritten for ``question`` (one question-conditioned pass, within budget)."""
        messages: list[BaseMessage] = [
            SystemMessage(content=MEMAGENT_SYSTEM),
            HumanMessage(content=MEMAGENT_FOCUS.format(memory=self.memory, question=question, budget=self.memory_tokens)),
        ]
        answer = self._ask(messages)
        return truncate_tokens(answer, self.memory_tokens) if answer else ""

    def respond(self, query: str, k: int = 10) -> str:
        """Answer from the question-focused memory (or the whole memory without the pass)."""
        from dualmem.frameworks.respond import answer_from_items

        text = self.focus(query) if self.question_pass and self.memory else ""
        unit = "focused-memory" if text else "memory"
        item = RetrievedItem(text=text or self.memory, kind="fact", score=1.0, id=unit, meta={"unit": unit})
        return answer_from_items(self.context, query, [item] if item.text else [])

    def reset(self) -> None:
        """Forget the memory and the chunk ledger of this namespace."""
        self.state.drop(self.namespace)
