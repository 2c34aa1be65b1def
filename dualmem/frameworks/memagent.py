"""``memagent``: MemAgent-style recurrent memory (arXiv 2507.02259), query-agnostic.

The history is read in chunks of ``settings.tuning.chunk_tokens`` tokens (cut at turn
boundaries; an over-long turn is split). After **every** chunk the model
rewrites one free-text memory of at most ``memory_tokens`` tokens (default
1,024): a longer answer is re-asked to be shortened (``settings.tuning.max_retries``
times), then cut to the budget, so the stored memory never exceeds it.

Choice (differs from the paper, which reads the history *with* the question):
ingest is incremental and query-agnostic, so one memory serves every question.
``retrieve(query, k)`` ranks the memory's lines by embedding similarity to the
query (no model call), each line citing as its source session the session whose
chunk first wrote it (a line kept word for word keeps its source; a reworded
line is new); ``respond(query)`` first runs one question-conditioned
pass over the memory (``MEMAGENT_FOCUS``), then answers from that focused memory
with the shared reader.

State lives in the framework's space (``{uri}/memagent``): the memory (text,
version, line sources, chunks read) is one value written with each rewrite, so
ingest resumes after a restart without re-reading chunks; the lines of the
current memory are records (embedded once per version) that ``retrieve`` searches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from dualmem.errors import ConfigurationError
from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, record_failure, render_turn, session_chunks, truncate_tokens
from dualmem.models.retry import invoke_with_retry
from dualmem.models.tokens import count_tokens
from dualmem.prompts.memagent import MEMAGENT_FOCUS, MEMAGENT_SHORTEN, MEMAGENT_SYSTEM, MEMAGENT_UPDATE
from dualmem.schema import Session, stable_id

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
        self.space = Space(context, self.name)

    # ------------------------------------------------------------------ memory

    def state(self) -> dict:
        """Return the stored memory: text, version, line sources, chunks read."""
        return self.space.value(MEMORY_KEY) or {"text": "", "version": 0}

    @property
    def memory(self) -> str:
        """Return the current memory text."""
        return self.state().get("text", "")

    @property
    def version(self) -> int:
        """Return how many chunks have rewritten the memory so far."""
        return self.state().get("version", 0)

    def _ask(self, messages: list[BaseMessage]) -> str:
        return _text(invoke_with_retry(self.context.chat(), messages, policy=self.context.settings))

    def _bounded(self, messages: list[BaseMessage], answer: str, stats: dict[str, int]) -> tuple[str, int]:
        """Return (answer within budget, model calls made): re-ask to shorten, then cut."""
        calls = 0
        for _ in range(self.context.settings.tuning.max_retries):
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
        """Read the session chunk by chunk, rewriting the memory after each chunk (once per session)."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, report))

    def _ingest(self, session: Session, report: IngestReport) -> None:
        from rich.progress import Progress

        stats = {"reasked": 0, "truncated": 0, "skipped": 0}
        chunks = session_chunks(session, self.context.settings.tuning.chunk_tokens)
        with Progress(transient=True, disable=len(chunks) < 4) as progress:
            task = progress.add_task(f"memagent {session.id}", total=len(chunks))
            for index, turns in enumerate(chunks):
                chunk_id = stable_id(*self.namespace, session.id, index, turns[0].id, turns[-1].id, prefix="c")
                progress.advance(task)
                current = self.state()
                if chunk_id in (current.get("chunks") or []):  # read by an earlier (interrupted) run
                    stats["skipped"] += 1
                    continue
                text = "\n".join(render_turn(t, session.time) for t in turns)
                try:
                    memory, calls = self.rewrite(current["text"], text, stats)
                except ConfigurationError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any model failure is recorded, never dropped
                    report.llm_calls += 1
                    record_failure(report, chunk_id, " ".join(str(exc).split())[:300])
                    continue
                report.llm_calls += calls
                earlier = current.get("sources")
                if earlier is None:  # state written before line sources: its lines come from its last session at best
                    earlier = {line: current.get("session_id") or session.id for line in _lines(current["text"])}
                sources = line_sources(memory, earlier, session.id)
                chunks_read = [*(current.get("chunks") or []), chunk_id]
                new = {
                    "text": memory,
                    "version": current["version"] + 1,
                    "session_id": session.id,
                    "sources": sources,
                    "chunks": chunks_read,
                }
                self.space.set_values({MEMORY_KEY: new})  # the memory and what it has read, in one commit
                report.items_written += 1
        report.meta.update(stats, memory_tokens=count_tokens(self.memory), version=self.version)

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` memory lines most similar to ``query``, best first."""
        state = self.state()
        lines = _lines(state.get("text", ""))
        if not lines:
            return []
        version = state.get("version", 0)
        if self.space.value("lines_version") != version:  # the memory changes only on ingest: its lines are stored once
            self.space.delete([r["id"] for r in self.space.records()])
            sources: dict[str, str] = state.get("sources") or {}
            records = [
                {"id": f"line{i}", "line": i, "session": sources.get(line), "text": line, "seq": i}
                for i, line in enumerate(lines)
            ]
            self.space.put(records, lines)
            self.space.set_values({"lines_version": version})
        ranked = sorted(self.space.search(query, k), key=lambda p: (-p[1], p[0]["line"]))
        return [
            RetrievedItem(
                text=r["text"],
                kind="fact",
                score=s,
                source_session=r["session"],
                id=r["id"],
                meta={"unit": "memory-line", "version": version},
            )
            for r, s in ranked
        ]

    def focus(self, question: str) -> str:
        """Return the memory rewritten for ``question`` (one question-conditioned pass, within budget)."""
        messages: list[BaseMessage] = [
            SystemMessage(content=MEMAGENT_SYSTEM),
            HumanMessage(
                content=MEMAGENT_FOCUS.format(memory=self.memory, question=question, budget=self.memory_tokens)
            ),
        ]
        answer = self._ask(messages)
        return truncate_tokens(answer, self.memory_tokens) if answer else ""

    def respond(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> str:
        """Answer from the question-focused memory (or the whole memory without the pass)."""
        from dualmem.frameworks.base import answer_from_items

        text = self.focus(query) if self.question_pass and self.memory else ""
        unit = "focused-memory" if text else "memory"
        item = RetrievedItem(text=text or self.memory, kind="fact", score=1.0, id=unit, meta={"unit": unit})
        return answer_from_items(self.context, query, [item] if item.text else [])

    def reset(self) -> None:
        """Forget the memory and the chunk ledger of this namespace."""
        self.space.drop()
