"""Protocol runners: RealMem replay, LoCoMo, RoleMemo — through the ``MemoryFramework`` interface only.

A runner takes one :class:`DatasetItem` (one persona's history and queries)
and a built framework, and returns one record per query: the query, the
retrieved items (kind, session, score), the answer when responding, metric
values, per-item hit marks and errors (judges run afterwards, see
:mod:`dualmem.evals.langsmith_adapter`). Records are plain JSON-able dicts.

With a journal (:class:`dualmem.evals.journal.StepLog`) every finished
query record and every ingested session is written once; a resumed runner
reads them back instead of asking the framework again, and replays the
sessions in the same order, so RealMem's "memory holds only earlier sessions"
holds across a resume.

Each query is retrieved with its conversation context: the turns of its own
session said before it (RealMem queries are user turns inside a session;
LoCoMo and RoleMemo questions are asked from outside, without context).

Retrieved items whose ``meta["expanded"]`` is true (grounding expansion:
facts added because a retrieved insight cites them) are kept in the record
but excluded from the recall metrics. Turn ids of an item are read from
``meta["turn_ids"]`` (or ``meta["source"]["turn_ids"]``), else from its id
when the id is a LoCoMo dialogue id (``D1:3``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dualmem.evals import metrics as m
from dualmem.evals.cost import phase
from dualmem.evals.journal import StepLog
from dualmem.frameworks.base import IngestReport, MemoryFramework, RetrievedItem
from dualmem.schema import DatasetItem, Query, Session, Turn

DIALOGUE_ID = re.compile(r"^D\d+:\d+$")
LOCOMO_KS = (5, 10, 20)
LOCOMO_SCORED = ("1", "2", "3", "4")  # category 5 (adversarial) is reported apart
OnRecord = Callable[[dict[str, Any]], None]
FAILED_CALLS = ("retrieve failed", "respond failed")


@dataclass
class RunOptions:
    """How a runner queries and scores: retrieval depth, answering, limits, similarity embedder, journal."""

    retrieve_k: int = 20
    respond_k: int = 10
    recall_k: int = 10
    respond: bool = True
    limit: int | None = None
    embed: Any = None  # Embeddings used for similarity metrics (RoleMemo recall, memory points)
    journal: StepLog | None = None
    on_record: OnRecord | None = None
    on_ingest: Callable[[Session], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers


LOCOMO_CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}


def category_name(protocol: str | None, category: str | None) -> str | None:
    """Return a query category by name (LoCoMo's numbers become multi-hop, temporal, …; names stay)."""
    if category is None:
        return None
    return LOCOMO_CATEGORIES.get(str(category), str(category)) if protocol == "locomo" else str(category)


def item_turn_ids(item: RetrievedItem) -> list[str]:
    """Return the dialogue turn ids an item comes from (see the module docstring)."""
    ids = item.meta.get("turn_ids") or (item.meta.get("source") or {}).get("turn_ids") or []
    if not ids and item.id and DIALOGUE_ID.match(item.id):
        ids = [item.id]
    return [str(i) for i in ids]


def serialise_item(item: RetrievedItem) -> dict[str, Any]:
    """Return a JSON-able view of a retrieved item."""
    return {
        "id": item.id,
        "kind": item.kind,
        "text": item.text,
        "score": float(item.score),
        "session": item.source_session,
        "sessions": item.sessions(),
        "turn_ids": item_turn_ids(item),
        "expanded": bool(item.meta.get("expanded")),
    }


def ranked_sessions(items: Sequence[dict[str, Any]]) -> list[str]:
    """Return the session ids of ranked items, in rank order, deduplicated."""
    return m.dedup(s for it in items for s in it["sessions"])


def ranked_turns(items: Sequence[dict[str, Any]]) -> list[str]:
    """Return the turn ids of ranked items, in rank order, deduplicated."""
    return m.dedup(t for it in items for t in it["turn_ids"])


def kept_queries(item: DatasetItem, limit: int | None) -> list[Query]:
    """Return the queries an evaluation keeps (the first ``limit``, or all)."""
    return list(item.queries if limit is None else item.queries[:limit])


def query_context(query: Query, item: DatasetItem) -> list[Turn]:
    """Return the turns of the query's own session said before it (empty when the query stands outside the dialogue)."""
    if query.session_id is None or not query.turn_index:
        return []
    for session in item.dialogue.sessions:
        if session.id == query.session_id:
            return list(session.turns[: query.turn_index])
    return []


def persona_text(item: DatasetItem) -> str:
    """Return the persona description judges see."""
    persona = item.dialogue.persona
    return persona.render() if persona else ""


def ask(framework: MemoryFramework, query: Query, item: DatasetItem, opts: RunOptions, protocol: str) -> dict[str, Any]:
    """Retrieve (and answer) one query; return its record before scoring."""
    record: dict[str, Any] = {
        "protocol": protocol,
        "persona": item.dialogue.id,
        "query_id": query.id,
        "query": query.text,
        "task_type": query.task_type,
        "category": query.category,
        "category_name": category_name(protocol, query.category),
        "session_id": query.session_id,
        "gold": query.gold.model_dump(),
        "reference_answer": query.answer,
        "retrieved": [],
        "answer": None,
        "metrics": {},
        "judges": {},
        "errors": [],
    }
    started = time.perf_counter()
    context = query_context(query, item)
    try:
        with phase("retrieval"):
            found = framework.retrieve(query.text, opts.retrieve_k, context=context)
        record["retrieved"] = [serialise_item(it) for it in found]
    except Exception as exc:  # noqa: BLE001 - recorded per query, the run goes on
        record["errors"].append(f"retrieve failed: {type(exc).__name__}: {exc}")
    record["retrieve_s"] = round(time.perf_counter() - started, 4)
    if opts.respond:
        started = time.perf_counter()
        try:
            with phase("answering"):
                record["answer"] = framework.respond(query.text, opts.respond_k, context=context)
        except Exception as exc:  # noqa: BLE001
            record["errors"].append(f"respond failed: {type(exc).__name__}: {exc}")
        record["respond_s"] = round(time.perf_counter() - started, 4)
    return record


def ingest_sessions(
    framework: MemoryFramework, sessions: Sequence[Session], opts: RunOptions, log: list[dict[str, Any]]
) -> None:
    """Ingest sessions in order in one :meth:`MemoryFramework.ingest_history` call (journaled ones are read back), a log
    row per session; sessions done together are journaled in one write, their time shared; failures logged, not raised."""
    j = opts.journal
    rows = {s.id: done for s in sessions if j is not None and (done := j.get("ingest", s.id)) is not None}
    for session in (s for s in sessions if s.id in rows and opts.on_ingest):  # ingested before a resume
        opts.on_ingest(session)  # type: ignore[misc]
    started = time.perf_counter()
    with phase("writing"):
        for done in framework.ingest_history([s for s in sessions if s.id not in rows]):
            seconds, started = (time.perf_counter() - started) / max(1, len(done)), time.perf_counter()
            new = {session.id: _ingest_row(session, report, seconds) for session, report in done}
            rows.update(new)
            if j is not None:  # a failed session is tried again on resume
                j.put_all("ingest", {key: row for key, row in new.items() if "error" not in row})
            for session in (s for s, _ in done if opts.on_ingest):
                opts.on_ingest(session)  # type: ignore[misc]
    log.extend(rows[s.id] for s in sessions if s.id in rows)


def _ingest_row(session: Session, report: IngestReport | Exception, seconds: float) -> dict[str, Any]:
    if isinstance(report, Exception):  # a failed session is reported, never dropped silently
        return {"session": session.id, "error": f"{type(report).__name__}: {report}"}
    errors = report.meta.get("errors") or {}
    return {
        "session": session.id,
        "items": report.items_written,
        "failed_chunks": list(report.failed_chunks),
        "chunk_errors": {c: str(errors.get(c) or "no reason recorded") for c in report.failed_chunks},
        "llm_calls": report.llm_calls,
        "seconds": round(seconds, 3),
    }


def answered(
    framework: MemoryFramework,
    query: Query,
    item: DatasetItem,
    opts: RunOptions,
    protocol: str,
    score: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Return the query's scored record: from the journal when it was answered before, else asked, scored and journaled."""
    if opts.journal is not None and (done := opts.journal.get("record", query.id)) is not None:
        return dict(done)
    record = ask(framework, query, item, opts, protocol)
    score(record)
    mark_hits(record)
    if opts.journal is not None and not any(e.startswith(FAILED_CALLS) for e in record["errors"]):
        opts.journal.put("record", query.id, record)  # a failed call is reported in this run and asked again on resume
    return record


def _finish(record: dict[str, Any], out: list[dict[str, Any]], opts: RunOptions) -> None:
    out.append(record)
    if opts.on_record:
        opts.on_record(record)


def _scored(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in record["retrieved"] if not r["expanded"]]


# --------------------------------------------------------------------------- scoring


def ragas_ids(record: dict[str, Any], recall_k: int = 10) -> tuple[list[str], list[str]] | None:
    """Return (retrieved ids, reference ids) of ragas' ID-based metrics: sessions (RealMem), turns (LoCoMo, RoleMemo)."""
    items = _scored(record)[:recall_k]
    gold = record["gold"]
    if record["protocol"] == "realmem" or (record["protocol"] == "rolememo" and not gold["turn_ids"]):
        return (ranked_sessions(items), list(gold["session_ids"])) if gold["session_ids"] else None
    return (ranked_turns(items), list(gold["turn_ids"])) if gold["turn_ids"] else None


def score_realmem(record: dict[str, Any], embed: Any = None, recall_k: int = 10) -> dict[str, float]:
    """Return RealMem session metrics, memory-point recall and ragas ID scores of one record."""
    items = _scored(record)
    gold_sessions = record["gold"]["session_ids"]
    out = dict(m.realmem_session_metrics(ranked_sessions(items), gold_sessions))
    if pair := ragas_ids(record, recall_k):
        out.update(m.ragas_id_scores(*pair))
    points = record["gold"]["memory_points"]
    if points and embed is not None:
        res = m.memory_point_recall(points, [r["text"] for r in items[:recall_k]], embed)
        out["memory_point_recall"] = res["memory_point_recall"]
    return out


def score_locomo(record: dict[str, Any], ks: Sequence[int] = LOCOMO_KS, recall_k: int = 10) -> dict[str, float]:
    """Return LoCoMo evidence recall@k over dialogue ids, session recall and ragas ID scores of one record."""
    items = _scored(record)
    gold_turns = record["gold"]["turn_ids"]
    if not gold_turns:
        return {}
    turns = ranked_turns(items)
    out = {f"evidence_recall@{k}": m.locomo_evidence_recall(turns, gold_turns, k) for k in ks}
    if pair := ragas_ids(record, recall_k):
        out.update(m.ragas_id_scores(*pair))
    sessions = ranked_sessions(items[:recall_k])
    out[f"session_recall@{recall_k}"] = m.id_context_recall(sessions, record["gold"]["session_ids"])
    return out


def score_rolememo(record: dict[str, Any], embed: Any, recall_k: int = 10) -> dict[str, Any]:
    """Return RoleMemo Recall@k of gold facts and insight among the top-k texts (either stream)."""
    gold = record["gold"]
    texts = [r["text"] for r in _scored(record)]
    res = m.rolememo_recall(gold["facts"], gold["insight"], texts, embed, k=recall_k)
    out: dict[str, Any] = {
        k: res[k]
        for k in ("fact_total", "fact_hit_count", "insight_total", "insight_hit_count", "fact_recall", "insight_recall")
    }
    out["fact_similarities"] = res["fact_similarities"]
    out["insight_similarity"] = res["insight_similarity"]
    out["retrieved_matches"] = res["retrieved_matches"]
    if pair := ragas_ids(record, recall_k):
        out.update(m.ragas_id_scores(*pair))
    return out


def mark_hits(record: dict[str, Any]) -> None:
    """Set ``hit`` on each retrieved item: the gold it matches (sessions, turns, or RoleMemo facts/insight), [] if none."""
    gold = record["gold"]
    matches = iter(record["metrics"].get("retrieved_matches") or [])
    for item in record["retrieved"]:
        if record["protocol"] == "rolememo":
            item["hit"] = [] if item["expanded"] else next(matches, [])
        elif record["protocol"] == "realmem":
            item["hit"] = [s for s in item["sessions"] if s in gold["session_ids"]]
        else:
            item["hit"] = [t for t in item["turn_ids"] if t in gold["turn_ids"]]


# --------------------------------------------------------------------------- runners


def realmem_plan(item: DatasetItem, limit: int | None = None) -> tuple[list[Session], dict[str, list[Query]]]:
    """Return the sessions to replay (up to the session of the last kept query) and the kept queries per session."""
    sessions = item.dialogue.sessions
    by_session: dict[str, list[Query]] = {}
    for q in kept_queries(item, limit):
        by_session.setdefault(q.session_id or "", []).append(q)
    unknown = set(by_session) - {s.id for s in sessions}
    if unknown:
        raise ValueError(
            f"queries point at sessions absent from the history: {sorted(unknown)[:3]}; reload the dataset"
        )
    if limit is not None:
        last = max((i for i, s in enumerate(sessions) if s.id in by_session), default=-1)
        sessions = sessions[: last + 1]
    for qs in by_session.values():
        qs.sort(key=lambda q: q.turn_index or 0)
    return sessions, by_session


def run_realmem(item: DatasetItem, framework: MemoryFramework, opts: RunOptions | None = None) -> dict[str, Any]:
    """Replay a RealMem history: each session's queries are answered from earlier sessions, then it is ingested."""
    opts = opts or RunOptions()
    sessions, by_session = realmem_plan(item, opts.limit)
    records: list[dict[str, Any]] = []
    ingest_log: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, session in enumerate(sessions):
        for query in by_session.get(session.id, []):

            def score(record: dict[str, Any], index: int = index) -> None:
                record["ingested_sessions"] = index
                leaked = [s for s in ranked_sessions(record["retrieved"]) if s not in seen]
                if leaked:
                    record["errors"].append(f"retrieved from sessions not yet ingested: {leaked[:5]}")
                record["metrics"] = score_realmem(record, opts.embed, opts.recall_k)

            _finish(answered(framework, query, item, opts, "realmem", score), records, opts)
        if opts.limit is not None and index == len(sessions) - 1:
            break  # the last session was only needed for its queries
        ingest_sessions(framework, [session], opts, ingest_log)
        seen.add(session.id)
    return {"persona": item.dialogue.id, "records": records, "ingest": ingest_log}


def run_locomo(item: DatasetItem, framework: MemoryFramework, opts: RunOptions | None = None) -> dict[str, Any]:
    """Ingest every LoCoMo session, then ask the QA items (categories 1-4 scored, 5 reported apart)."""
    opts = opts or RunOptions()
    ingest_log: list[dict[str, Any]] = []
    ingest_sessions(framework, item.dialogue.sessions, opts, ingest_log)
    records: list[dict[str, Any]] = []
    for query in kept_queries(item, opts.limit):

        def score(record: dict[str, Any], query: Query = query) -> None:
            record["metrics"] = score_locomo(record, recall_k=opts.recall_k)
            record["scored"] = query.category in LOCOMO_SCORED

        _finish(answered(framework, query, item, opts, "locomo", score), records, opts)
    return {"persona": item.dialogue.id, "records": records, "ingest": ingest_log}


def run_rolememo(item: DatasetItem, framework: MemoryFramework, opts: RunOptions | None = None) -> dict[str, Any]:
    """Ingest the whole RoleMemo history, then retrieve (and answer) each query."""
    opts = opts or RunOptions()
    if opts.embed is None:
        raise ValueError("RoleMemo recall needs a similarity embedder: pass RunOptions(embed=load_embeddings(...))")
    ingest_log: list[dict[str, Any]] = []
    ingest_sessions(framework, item.dialogue.sessions, opts, ingest_log)
    records: list[dict[str, Any]] = []
    for query in kept_queries(item, opts.limit):

        def score(record: dict[str, Any]) -> None:
            record["metrics"] = score_rolememo(record, opts.embed, opts.recall_k)

        _finish(answered(framework, query, item, opts, "rolememo", score), records, opts)
    return {"persona": item.dialogue.id, "records": records, "ingest": ingest_log}


RUNNERS: dict[str, Callable[[DatasetItem, MemoryFramework, RunOptions | None], dict[str, Any]]] = {
    "realmem": run_realmem,
    "locomo": run_locomo,
    "rolememo": run_rolememo,
}


def run_item(
    kind: str, item: DatasetItem, framework: MemoryFramework, opts: RunOptions | None = None
) -> dict[str, Any]:
    """Run the protocol ``kind`` (realmem, locomo, rolememo) on one persona."""
    try:
        runner = RUNNERS[kind]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; use one of {', '.join(RUNNERS)}") from None
    return runner(item, framework, opts)
