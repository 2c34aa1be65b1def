"""``bookmarks``: a BOOKMARKS-style search memory of question–answer bookmarks tied to a point of the story.

``ingest`` keeps the history searchable: every session is cut into chunks of
``Settings.chunk_tokens`` tokens (whole turns), embedded and stored with the
session's ordinal. The *point of the story* is (session ordinal, last turn
index) of the newest session ingested. No model call happens at ingest.

``retrieve(query, k)`` treats the query as a task:

1. *propose* — the chat model proposes up to ``max_questions`` questions the
   task needs answered (the query itself when that call fails);
2. for each question, the nearest bookmark by question embedding with cosine
   >= ``same_question`` is the same question:
   - *reuse* it when it is at the current point (no model call);
   - *derive* it when it is stale: the model updates its answer reading only
     chunks of the sessions after its point (the most relevant, within
     ``read_tokens``), and the bookmark moves to the current point;
   - else *create* one: the model answers from the ``evidence_k`` chunks of the
     whole history most relevant to the question (within ``read_tokens``);
3. return the bookmarks (kind ``insight``, ``Q: … A: …``, best match to the
   query first), then the chunks they were answered from, then the other
   chunks most relevant to the query (kind ``fact``), ``k`` in all.

What each retrieval did is in ``last_actions`` (``(action, question, bookmark
id)``) and its failed model calls in ``last_failures``. Bookmarks and chunks
live in ``{uri}/bookmarks`` and survive restarts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.full_context import LanceState, render_turn, session_chunks, truncate_tokens
from dualmem.nodes.emotion import cosine, cosines
from dualmem.prompts.bookmarks import BOOKMARKS_CREATE, BOOKMARKS_DERIVE, BOOKMARKS_PROPOSE, BOOKMARKS_SYSTEM
from dualmem.schema import Session, stable_id
from dualmem.structured import invoke_structured
from dualmem.tokens import count_tokens_batch


class Questions(BaseModel):
    """Questions a task needs answered from the history."""

    questions: list[str] = Field(default_factory=list, description="short self-contained questions")


class BookmarkAnswer(BaseModel):
    """An answer to a bookmarked question."""

    answer: str = Field(description="the answer as of the latest session shown, under 80 words")
    changed: bool = Field(default=True, description="false when the newer sessions change nothing")


def point_label(point: dict[str, Any]) -> str:
    """Return a readable label of a point of the story."""
    return f"session {point['session']} ({point.get('session_id') or '?'}), turn {point.get('turn', 0)}"


def _before(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["session"], a.get("turn", 0)) < (b["session"], b.get("turn", 0))


class BookmarksFramework(MemoryFramework):
    """Answer a task through question–answer bookmarks, reused, derived or created at the current point."""

    name = "bookmarks"
    description = "BOOKMARKS-style search memory: Q&A bookmarks tied to a story point; reuse, derive or create"

    def __init__(
        self,
        context: FrameworkContext,
        max_questions: int = 3,
        same_question: float = 0.9,
        evidence_k: int = 5,
        read_tokens: int | None = None,
    ) -> None:
        super().__init__(context)
        self.max_questions = max_questions
        self.same_question = same_question
        self.evidence_k = evidence_k
        self.read_tokens = read_tokens or 4 * context.settings.chunk_tokens
        self.state = LanceState(f"{context.uri}/{self.name}")
        self.namespace = tuple(context.namespace)
        self.last_actions: list[tuple[str, str, str | None]] = []
        self.last_failures: dict[str, str] = {}

    # ------------------------------------------------------------------ state

    def meta(self) -> dict[str, Any]:
        """Return the sessions ingested and the current point of the story."""
        default = {"sessions": [], "point": {"session": 0, "session_id": None, "turn": 0}}
        return {**default, **(self.state.get(self.namespace, "meta") or {})}

    def chunks(self) -> list[dict[str, Any]]:
        """Return the stored history chunks, oldest first."""
        return [value for _, value in self.state.items(self.namespace, "chunk:")]

    def bookmarks(self) -> list[dict[str, Any]]:
        """Return every bookmark, oldest first."""
        return [value for _, value in self.state.items(self.namespace, "bm:")]

    # ------------------------------------------------------------------ ingest

    def ingest(self, session: Session) -> IngestReport:
        """Store the session's chunks (embedded) and move the point of the story to its end."""
        meta = self.meta()
        report = IngestReport(session_id=session.id)
        if session.id in meta["sessions"]:
            report.meta["skipped"] = "session already ingested"
            return report
        ordinal = len(meta["sessions"]) + 1
        records: list[dict[str, Any]] = []
        parts = session_chunks(session, self.context.settings.chunk_tokens)
        for index, turns in enumerate(tqdm(parts, desc=f"bookmarks {session.id}", disable=len(parts) < 4, leave=False)):
            records.append({
                "id": stable_id(session.id, index, prefix="k"), "session": session.id, "ordinal": ordinal,
                "time": session.time, "turn_ids": [t.id for t in turns],
                "text": "\n".join(render_turn(t, session.time if i == 0 else None) for i, t in enumerate(turns)),
            })
        if records:
            vectors = self.context.embedder().embed_documents([r["text"] for r in records])
            sizes = count_tokens_batch([r["text"] for r in records])
            for record, vector, size in zip(records, vectors, sizes, strict=True):
                record.update(vector=list(vector), tokens=size)
        meta["sessions"] = [*meta["sessions"], session.id]
        meta["point"] = {"session": ordinal, "session_id": session.id, "turn": max(len(session.turns) - 1, 0)}
        self.state.put(self.namespace, {**{f"chunk:{r['id']}": r for r in records}, "meta": meta})
        report.items_written = len(records)
        return report

    # ------------------------------------------------------------------ retrieve

    def _ask(self, schema: type[BaseModel], prompt: str, label: str) -> Any:
        messages = [SystemMessage(content=BOOKMARKS_SYSTEM), HumanMessage(content=prompt)]
        result = invoke_structured(self.context.chat(), messages, schema, retries=self.context.settings.max_retries, policy=self.context.settings)
        if not result.ok:
            self.last_failures[label] = result.error or "invalid answer"
        return result.value

    def _read(self, chunks: list[dict[str, Any]], qvec: list[float], limit: int) -> list[dict[str, Any]]:
        """Return the chunks most relevant to ``qvec`` within ``read_tokens`` (at least one), in story order."""
        if not chunks:
            return []
        sims = cosines(qvec, [c["vector"] for c in chunks])
        picked: list[dict[str, Any]] = []
        used = 0
        for i in sorted(range(len(chunks)), key=lambda i: -sims[i])[:limit]:
            if picked and used + chunks[i]["tokens"] > self.read_tokens:
                break
            picked.append({**chunks[i], "relevance": sims[i]})
            used += chunks[i]["tokens"]
        return sorted(picked, key=lambda c: (c["ordinal"], c["id"]))

    def _excerpts(self, chunks: list[dict[str, Any]]) -> str:
        return "\n\n".join(
            f"[session {c['ordinal']} ({c['session']})]\n{truncate_tokens(c['text'], self.read_tokens)}" for c in chunks
        ) or "(none)"

    def propose(self, task: str) -> list[str]:
        """Return the questions ``task`` needs answered (``[task]`` when the model fails)."""
        persona = f" playing {self.context.persona.name}" if self.context.persona else ""
        value = self._ask(Questions, BOOKMARKS_PROPOSE.format(persona=persona, task=task, n=self.max_questions), "propose")
        questions = [q.strip() for q in (value.questions if value else []) if q.strip()]
        return list(dict.fromkeys(questions))[: self.max_questions] or [task]

    def _bookmark_for(self, question: str, qvec: list[float], marks: list[dict[str, Any]], point: dict[str, Any],
                      chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Return the bookmark answering ``question`` at ``point``: reused, derived or created."""
        sims = [cosine(qvec, m["qvector"]) for m in marks]
        best = max(range(len(marks)), key=lambda i: sims[i], default=None)
        if best is not None and sims[best] >= self.same_question:
            mark = dict(marks[best])
            if not _before(mark["point"], point):
                self.last_actions.append(("reuse", question, mark["id"]))
                return mark
            newer = [c for c in chunks if c["ordinal"] > mark["point"]["session"]]
            read = self._read(newer, qvec, self.evidence_k)
            if not read:  # the newer sessions hold no turns: nothing to read, the answer stands
                mark["point"] = dict(point)
                self.last_actions.append(("derive", question, mark["id"]))
                return mark
            prompt = BOOKMARKS_DERIVE.format(question=mark["question"], old_point=point_label(mark["point"]),
                                             answer=mark["answer"], point=point_label(point), excerpts=self._excerpts(read))
            value = self._ask(BookmarkAnswer, prompt, f"derive:{mark['id']}")
            if value is None:
                self.last_actions.append(("stale", question, mark["id"]))
                return mark  # kept at its old point; the failure is in last_failures
            if value.changed:
                mark["answer"] = value.answer
                mark["evidence"] = list(dict.fromkeys([*mark["evidence"], *(c["id"] for c in read)]))
            mark.update(point=dict(point), derived=mark.get("derived", 0) + 1)
            self.last_actions.append(("derive", question, mark["id"]))
            return mark
        read = self._read(chunks, qvec, self.evidence_k)
        prompt = BOOKMARKS_CREATE.format(question=question, point=point_label(point), excerpts=self._excerpts(read))
        value = self._ask(BookmarkAnswer, prompt, f"create:{question}")
        if value is None:
            self.last_actions.append(("failed", question, None))
            return None
        mark = {"id": stable_id(question, point["session"], prefix="b"), "question": question, "qvector": qvec,
                "answer": value.answer, "point": dict(point), "created_at": dict(point),
                "evidence": [c["id"] for c in read], "derived": 0}
        self.last_actions.append(("create", question, mark["id"]))
        return mark

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return bookmarks brought up to the current point for the task ``query``, then their evidence."""
        self.last_actions, self.last_failures = [], {}
        point = self.meta()["point"]
        chunks = self.chunks()
        if not chunks:
            return []
        embedder = self.context.embedder()
        questions = self.propose(query)
        qvecs = [list(v) for v in embedder.embed_documents(questions)]
        marks = self.bookmarks()
        used: dict[str, dict[str, Any]] = {}
        for question, qvec in zip(questions, qvecs, strict=True):
            mark = self._bookmark_for(question, qvec, marks, point, chunks)
            if mark is None:
                continue
            used[mark["id"]] = mark
            marks = [m for m in marks if m["id"] != mark["id"]] + [mark]
        if used:
            self.state.put(self.namespace, {f"bm:{i}": m for i, m in used.items()})
        return self._items(query, list(used.values()), chunks, k)

    def _items(self, query: str, marks: list[dict[str, Any]], chunks: list[dict[str, Any]], k: int) -> list[RetrievedItem]:
        qvec = self.context.embedder().embed_query(query)
        by_id = {c["id"]: c for c in chunks}
        out: list[RetrievedItem] = []
        mark_sims = cosines(qvec, [m["qvector"] for m in marks])
        for sim, mark in sorted(zip(mark_sims, marks, strict=True), key=lambda p: -p[0]):
            sessions = list(dict.fromkeys(by_id[e]["session"] for e in mark["evidence"] if e in by_id))
            out.append(RetrievedItem(
                text=f"Q: {mark['question']}\nA: {mark['answer']}", kind="insight", score=1.0 + sim,
                source_session=sessions[-1] if sessions else None, id=mark["id"], source_sessions=sessions,
                meta={"unit": "bookmark", "question": mark["question"], "point": mark["point"],
                      "evidence": mark["evidence"], "derived": mark.get("derived", 0)},
            ))
        evidence = {e for m in marks for e in m["evidence"] if e in by_id}
        sims = cosines(qvec, [c["vector"] for c in chunks])
        # the bookmarks' evidence first, then the rest of the history, each by relevance to the query
        order = sorted(range(len(chunks)), key=lambda i: (chunks[i]["id"] not in evidence, -sims[i]))
        for i in order[: max(k - len(out), 0)]:
            chunk = chunks[i]
            out.append(RetrievedItem(
                text=chunk["text"], kind="fact", score=sims[i], source_session=chunk["session"], id=chunk["id"],
                meta={"unit": "chunk", "turn_ids": chunk["turn_ids"], "evidence": chunk["id"] in evidence},
            ))
        return out[:k]

    def reset(self) -> None:
        """Forget the history and every bookmark of this namespace."""
        self.state.drop(self.namespace)
