"""``bookmarks``: a BOOKMARKS-style search memory of question–answer bookmarks tied to a point of the story.

``ingest`` keeps the history searchable: every session is cut into chunks of
``Settings.tuning.chunk_tokens`` tokens (whole turns), embedded and stored with the
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
id)``) and its failed model calls in ``last_failures``. Chunks and bookmarks are
records of the framework's space (``{uri}/bookmarks``; a bookmark is embedded
from its question), searched on the namespace's RAM view, and survive
restarts; a session is ingested once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, render_turn, session_chunks, truncate_tokens
from dualmem.models.structured import invoke_structured
from dualmem.models.tokens import count_tokens_batch
from dualmem.prompts.bookmarks import BOOKMARKS_CREATE, BOOKMARKS_DERIVE, BOOKMARKS_PROPOSE, BOOKMARKS_SYSTEM
from dualmem.schema import Session, stable_id

MARKS = "bookmarks"


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
        self.read_tokens = read_tokens or 4 * context.settings.tuning.chunk_tokens
        self.space = Space(context, self.name)
        self.namespace = tuple(context.namespace)
        self.last_actions: list[tuple[str, str, str | None]] = []
        self.last_failures: dict[str, str] = {}

    # ------------------------------------------------------------------ state

    def meta(self) -> dict[str, Any]:
        """Return the sessions ingested and the current point of the story."""
        default = {"sessions": [], "point": {"session": 0, "session_id": None, "turn": 0}}
        return {**default, **(self.space.value("meta") or {})}

    def chunks(self) -> list[dict[str, Any]]:
        """Return the stored history chunks, oldest first."""
        return self.space.records()

    def bookmarks(self) -> list[dict[str, Any]]:
        """Return every bookmark, oldest first."""
        return self.space.records(MARKS)

    def _ranked(self, qvec: list[float], collection: str = "records") -> list[tuple[dict[str, Any], float]]:
        """Return every record of a collection with its cosine to ``qvec``, best first."""
        total = self.space.count(collection)
        return self.space.search(qvec, total, collection) if total else []

    # ------------------------------------------------------------------ ingest

    def ingest(self, session: Session) -> IngestReport:
        """Store the session's chunks (embedded) and move the point of the story to its end (once per session)."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, self.meta(), report))

    def _ingest(self, session: Session, meta: dict[str, Any], report: IngestReport) -> None:
        ordinal = len(meta["sessions"]) + 1
        seq = self.space.count()
        records: list[dict[str, Any]] = []
        parts = session_chunks(session, self.context.settings.tuning.chunk_tokens)
        for index, turns in enumerate(tqdm(parts, desc=f"bookmarks {session.id}", disable=len(parts) < 4, leave=False)):
            records.append(
                {
                    "id": stable_id(session.id, index, prefix="k"),
                    "session": session.id,
                    "ordinal": ordinal,
                    "time": session.time,
                    "turn_ids": [t.id for t in turns],
                    "seq": seq + index,
                    "text": "\n".join(render_turn(t, session.time if i == 0 else None) for i, t in enumerate(turns)),
                }
            )
        for record, size in zip(
            records, count_tokens_batch([r["text"] for r in records]) if records else [], strict=True
        ):
            record["tokens"] = size
        self.space.put(records, [r["text"] for r in records])
        meta["sessions"] = [*meta["sessions"], session.id]
        meta["point"] = {"session": ordinal, "session_id": session.id, "turn": max(len(session.turns) - 1, 0)}
        self.space.set_values({"meta": meta})
        report.items_written = len(records)

    # ------------------------------------------------------------------ retrieve

    def _ask(self, schema: type[BaseModel], prompt: str, label: str) -> Any:
        messages = [SystemMessage(content=BOOKMARKS_SYSTEM), HumanMessage(content=prompt)]
        result = invoke_structured(
            self.context.chat(),
            messages,
            schema,
            retries=self.context.settings.tuning.max_retries,
            policy=self.context.settings,
        )
        if not result.ok:
            self.last_failures[label] = result.error or "invalid answer"
        return result.value

    def _read(self, qvec: list[float], limit: int, after: int = 0) -> list[dict[str, Any]]:
        """Return the chunks (of sessions after ``after``) most relevant to ``qvec`` within ``read_tokens``, in story order."""
        picked: list[dict[str, Any]] = []
        used = 0
        for chunk, sim in [(c, s) for c, s in self._ranked(qvec) if c["ordinal"] > after][:limit]:
            if picked and used + chunk["tokens"] > self.read_tokens:
                break
            picked.append({**chunk, "relevance": sim})
            used += chunk["tokens"]
        return sorted(picked, key=lambda c: (c["ordinal"], c["id"]))

    def _excerpts(self, chunks: list[dict[str, Any]]) -> str:
        return (
            "\n\n".join(
                f"[session {c['ordinal']} ({c['session']})]\n{truncate_tokens(c['text'], self.read_tokens)}"
                for c in chunks
            )
            or "(none)"
        )

    def propose(self, task: str) -> list[str]:
        """Return the questions ``task`` needs answered (``[task]`` when the model fails)."""
        persona = f" playing {self.context.persona.name}" if self.context.persona else ""
        value = self._ask(
            Questions, BOOKMARKS_PROPOSE.format(persona=persona, task=task, n=self.max_questions), "propose"
        )
        questions = [q.strip() for q in (value.questions if value else []) if q.strip()]
        return list(dict.fromkeys(questions))[: self.max_questions] or [task]

    def _bookmark_for(
        self, question: str, qvec: list[float], marks: dict[str, dict[str, Any]], point: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Return the bookmark answering ``question`` at ``point``: reused, derived or created."""
        nearest = self._ranked(qvec, MARKS)[:1]
        if nearest and nearest[0][1] >= self.same_question:
            mark = dict(marks.get(nearest[0][0]["id"], nearest[0][0]))  # this retrieval's version when it changed it
            if not _before(mark["point"], point):
                self.last_actions.append(("reuse", question, mark["id"]))
                return mark
            read = self._read(qvec, self.evidence_k, after=mark["point"]["session"])
            if not read:  # the newer sessions hold no turns: nothing to read, the answer stands
                mark["point"] = dict(point)
                self.last_actions.append(("derive", question, mark["id"]))
                return mark
            prompt = BOOKMARKS_DERIVE.format(
                question=mark["question"],
                old_point=point_label(mark["point"]),
                answer=mark["answer"],
                point=point_label(point),
                excerpts=self._excerpts(read),
            )
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
        read = self._read(qvec, self.evidence_k)
        prompt = BOOKMARKS_CREATE.format(question=question, point=point_label(point), excerpts=self._excerpts(read))
        value = self._ask(BookmarkAnswer, prompt, f"create:{question}")
        if value is None:
            self.last_actions.append(("failed", question, None))
            return None
        mark = {
            "id": stable_id(question, point["session"], prefix="b"),
            "question": question,
            "answer": value.answer,
            "point": dict(point),
            "created_at": dict(point),
            "evidence": [c["id"] for c in read],
            "derived": 0,
            "seq": self.space.count(MARKS),
        }
        self.last_actions.append(("create", question, mark["id"]))
        return mark

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return bookmarks brought up to the current point for the task ``query``, then their evidence."""
        self.last_actions, self.last_failures = [], {}
        point = self.meta()["point"]
        if not self.space.count():
            return []
        questions = self.propose(query)
        qvecs = [list(v) for v in self.space.store.embeddings.embed_documents(questions)]
        used: dict[str, dict[str, Any]] = {}
        for question, qvec in zip(questions, qvecs, strict=True):
            mark = self._bookmark_for(question, qvec, used, point)
            if mark is None:
                continue
            used[mark["id"]] = mark
            self.space.put([mark], [mark["question"]], collection=MARKS)  # a bookmark is found by its question
        return self._items(query, list(used.values()), k)

    def _items(self, query: str, marks: list[dict[str, Any]], k: int) -> list[RetrievedItem]:
        qvec = self.space.store.embeddings.embed_query(query)
        ranked = self._ranked(qvec)
        by_id = {c["id"]: c for c, _ in ranked}
        out: list[RetrievedItem] = []
        mark_sims = {m["id"]: s for m, s in self._ranked(qvec, MARKS)}
        for sim, mark in sorted(((mark_sims.get(m["id"], 0.0), m) for m in marks), key=lambda p: -p[0]):
            sessions = list(dict.fromkeys(by_id[e]["session"] for e in mark["evidence"] if e in by_id))
            out.append(
                RetrievedItem(
                    text=f"Q: {mark['question']}\nA: {mark['answer']}",
                    kind="insight",
                    score=1.0 + sim,
                    source_session=sessions[-1] if sessions else None,
                    id=mark["id"],
                    source_sessions=sessions,
                    meta={
                        "unit": "bookmark",
                        "question": mark["question"],
                        "point": mark["point"],
                        "evidence": mark["evidence"],
                        "derived": mark.get("derived", 0),
                    },
                )
            )
        evidence = {e for m in marks for e in m["evidence"] if e in by_id}
        # the bookmarks' evidence first, then the rest of the history, each by relevance to the query
        order = sorted(ranked, key=lambda pair: (pair[0]["id"] not in evidence, -pair[1]))
        for chunk, sim in order[: max(k - len(out), 0)]:
            out.append(
                RetrievedItem(
                    text=chunk["text"],
                    kind="fact",
                    score=sim,
                    source_session=chunk["session"],
                    id=chunk["id"],
                    meta={"unit": "chunk", "turn_ids": chunk["turn_ids"], "evidence": chunk["id"] in evidence},
                )
            )
        return out[:k]

    def reset(self) -> None:
        """Forget the history and every bookmark of this namespace."""
        self.space.drop()
