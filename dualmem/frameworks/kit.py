"""The toolkit every memory framework builds on: storage, chunking, asking the model, recording failures.

- :class:`Space` — where a framework keeps its memory, in the one storage
  stack: its *records* (notes, memory pieces, fragments, chunks…) are rows of a
  ``DualStore`` at ``{uri}/{framework}`` (embedded, searched exactly on the
  namespace's in-RAM view; fresh across processes), its small *values*
  (summaries, clocks, counters) items of the LangGraph store at the same
  folder, and ``once(session)`` ingests a session exactly once across writers
  and restarts (write lease + ledger).
- :func:`session_chunks` — the writer's chunker (:func:`dualmem.memory.chunking.split_turns`):
  whole turns up to a token budget, never splitting a turn.
- :func:`ask` — a structured question to the chat model with repairs; a failure is
  recorded in the ingest report one way (``failed_chunks`` plus its reason).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.store.base import PutOp
from pydantic import BaseModel

from dualmem.frameworks.base import FrameworkContext, IngestReport
from dualmem.memory.chunking import split_turns
from dualmem.models.structured import invoke_structured
from dualmem.models.tokens import count_tokens
from dualmem.schema import Fact, Session, SourceRef, Turn
from dualmem.stores.langgraph_store import langgraph_view

RECORD = "records"


def render_turn(turn: Turn, time: str | None = None) -> str:
    """Render one turn as a transcript line."""
    who = turn.speaker or turn.role
    stamp = f"[{time}] " if time else ""
    return f"{stamp}{who}: {turn.text}"


def truncate_tokens(text: str, limit: int, keep: str = "start") -> str:
    """Cut ``text`` to at most ``limit`` tokens at a word boundary, keeping its start or end."""
    if limit <= 0:
        return ""
    if count_tokens(text) <= limit:
        return text
    words = text.split()
    lo, hi = 0, len(words)  # the largest n words that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        part = words[:mid] if keep == "start" else words[len(words) - mid :]
        if count_tokens(" ".join(part)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    part = words[:lo] if keep == "start" else words[len(words) - lo :]
    return " ".join(part)


def session_chunks(session: Session, max_tokens: int) -> list[list[Turn]]:
    """Split a session into runs of whole turns of at most ``max_tokens`` tokens (the writer's chunking)."""
    return [group for group, _ in split_turns(session.turns, max_tokens)]


def record_failure(report: IngestReport, label: str, error: str | None) -> None:
    """Record that the unit ``label`` of an ingest failed, and why."""
    report.failed_chunks.append(label)
    report.meta.setdefault("errors", {})[label] = error or "failed"


def ask(
    context: FrameworkContext, schema: type[BaseModel], messages: list[BaseMessage], report: IngestReport, label: str
) -> Any:
    """Ask the chat model for ``schema`` (repairs and transient retries as the settings say); None when it failed.

    Every call counts in ``report.llm_calls``; a failure is recorded under ``label``.
    """
    s = context.settings
    out = invoke_structured(context.chat(), messages, schema, retries=s.tuning.max_retries, policy=s)
    report.llm_calls += out.attempts
    if not out.ok or out.value is None:
        record_failure(report, label, out.error)
        return None
    return out.value


def _emotion(emotions: Sequence[Sequence[float] | None] | None, i: int) -> list[float] | None:
    vector = None if emotions is None else emotions[i]
    return None if vector is None else [float(v) for v in vector]


class Space:
    """A framework's storage: records (searchable), values, and exactly-once sessions, per namespace."""

    def __init__(self, context: FrameworkContext, name: str) -> None:
        self.context, self.name = context, name
        self.store = context.open_store(name)
        self.namespace = tuple(context.namespace)
        self.kv = langgraph_view(self.store)

    def _ns(self, collection: str) -> tuple[str, ...]:
        return (*self.namespace, collection)

    # ------------------------------------------------------------------ records

    def put(
        self,
        records: Sequence[dict[str, Any]],
        texts: Sequence[str],
        *,
        collection: str = RECORD,
        vectors: Sequence[Sequence[float]] | None = None,
        emotions: Sequence[Sequence[float] | None] | None = None,
        embed: bool = True,
    ) -> None:
        """Store records (dicts with an ``id``; ``session`` and ``time`` when known), each embedded from its text.

        ``embed=False`` stores records never searched by meaning (zero vectors, nothing embedded).
        """
        if not records:
            return
        if not embed:
            vectors = [[0.0] * self.store.dims] * len(records)
        items = [
            Fact(
                id=str(r["id"]),
                namespace=self._ns(collection),
                text=text or " ",
                source=SourceRef(session_id=r.get("session"), turn_ids=list(r.get("turn_ids") or [])),
                event_time=r.get("time"),
                meta={k: v for k, v in r.items() if k != "vector"},
                emotion=_emotion(emotions, i),
            )
            for i, (r, text) in enumerate(zip(records, texts, strict=True))
        ]
        self.store.upsert(items, vectors=vectors)

    def records(self, collection: str = RECORD) -> list[dict[str, Any]]:
        """Return every record of a collection, oldest first (by ``seq`` when records carry one)."""
        rows = [item.meta for item in self.store.list(self._ns(collection), status="active", newest_first=False)]
        return sorted(rows, key=lambda r: r.get("seq", 0))

    def get(self, ids: Sequence[str], collection: str = RECORD) -> list[dict[str, Any]]:
        """Return the records with these ids (missing ones skipped)."""
        return [item.meta for item in self.store.get(self._ns(collection), list(ids))]

    def search(
        self, query: str | Sequence[float], k: int, collection: str = RECORD
    ) -> list[tuple[dict[str, Any], float]]:
        """Return the ``k`` records most similar to ``query`` (text or vector), with their cosine, best first."""
        ns = self._ns(collection)
        vector = self.store.embeddings.embed_query(query) if isinstance(query, str) else list(query)
        hits = self.store.search(ns, "", kind="fact", k=k, mode="vector", vector=vector)
        return [(h.item.meta, float(h.score)) for h in hits]

    def count(self, collection: str = RECORD) -> int:
        """Return how many records a collection holds."""
        return self.store.count(self._ns(collection))

    def delete(self, ids: Sequence[str], collection: str = RECORD) -> None:
        """Delete records."""
        self.store.delete(self._ns(collection), list(ids))

    # ------------------------------------------------------------------ values

    def value(self, key: str, default: Any = None) -> Any:
        """Return a stored value (``default`` when absent)."""
        found = self.kv.get((self.name, *self.namespace), key)
        return default if found is None else found.value.get("value", default)

    def set_values(self, values: dict[str, Any]) -> None:
        """Store several values at once (one commit)."""
        ns = (self.name, *self.namespace)
        self.kv.batch([PutOp(ns, key, {"value": value}, index=False) for key, value in values.items()])

    # ------------------------------------------------------------------ exactly once

    @contextmanager
    def once(self, unit: str, report: IngestReport | None = None) -> Iterator[bool]:
        """Hold the namespace's write lease; yield whether ``unit`` (a session) still has to be ingested.

        A unit that runs to the end of the block with no failure recorded in ``report``
        is marked done in the ledger; one that raised or failed somewhere is not, so a
        re-run (any process) does it again (the framework skips the parts it kept).
        """
        with self.store.exclusive(self.namespace):
            if self.store.ledger.applied(self.namespace, unit):
                yield False
                return
            yield True
            if report is None or not report.failed_chunks:
                self.store.ledger.mark(self.namespace, unit, "applied", "")

    def ingest_once(self, session_id: str, work: Callable[[IngestReport], None]) -> IngestReport:
        """Run ``work`` on the session's report unless the session was ingested before (by any process).

        The session is marked done only when ``work`` records no failure (see :meth:`once`).
        """
        report = IngestReport(session_id=session_id)
        with self.once(session_id, report) as todo:
            if todo:
                work(report)
            else:
                report.meta["skipped"] = "session already ingested"
        return report

    def drop(self) -> None:
        """Forget every record, value and ledger row of this namespace."""
        for ns in self.store.namespaces(self.namespace):
            self.store.drop_namespace(ns)
        self.store.drop_namespace(self.namespace)
        ns = (self.name, *self.namespace)
        keys = [i.key for i in self.kv.search(ns, limit=10_000)]
        self.kv.batch([PutOp(ns, key, None) for key in keys])
