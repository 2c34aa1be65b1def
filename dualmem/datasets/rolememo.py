"""RoleMemo format (``rolememo/1``): loader and atomic writer.

One file holds one persona's history with one user and its test queries; a
dataset is a single file or a folder of such files (sorted by name)::

    {
      "format": "rolememo/1",
      "id": "nurse-mara-u1",                  # optional; default: the file name stem
      "persona": {"id": str, "name": str, "description": str, "core_values": [str],
                  "traits": [str], "background": str, "expertise": [str], "goals": [str],
                  ...},                        # dualmem.schema.Persona; extra keys kept
      "user_id": "u1",
      "history": [                             # sessions in time order
        {"session_id": str, "time": str|null,
         "filler": bool,                       # optional, default false
         "meta": {...},                        # optional
         "turns": [{"turn_id": str, "role": "user"|"assistant", "speaker": str,
                    "content": str, "meta": {...}?}]}
      ],
      "queries": [
        {"query_id": str, "question": str,
         "task_type": "Decision Guidance" | "Interpretive Attribution"
                      | "Value Judgment" | "Contradiction Revelation",
         "core_fragments": [str, str],         # exactly two mundane facts
         "core_insight": str,                  # the persona's interpretation
         "evidence": [{"session_id": str, "turn_id": str, "fragment": str}],
         "reference_answer": str,              # optional
         "time": str,                          # optional: when the query is asked
         "meta": {...}}                        # optional
      ],
      "meta": {...}                            # optional (generator settings, depths...)
    }

Every ``evidence`` entry must name a session and a turn of ``history``; turn
ids and query ids are unique in a file. Mapping onto :mod:`dualmem.schema`:
``Query.gold.facts`` = core fragments, ``gold.insight`` = core insight,
``gold.turn_ids`` / ``gold.session_ids`` from the evidence (the full evidence
list is kept in ``Query.meta["evidence"]``), ``answer`` = reference answer.
"""

from __future__ import annotations

import re
from collections.abc import Container
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dualmem.datasets._validate import json_files, read_json, unique, validate, write_json_atomic
from dualmem.errors import DatasetError
from dualmem.schema import Dataset, DatasetItem, Dialogue, GoldEvidence, Persona, Query, Session, TaskType, Turn

FORMAT = "rolememo/1"


class RawTurn(BaseModel):
    """One RoleMemo turn."""

    model_config = ConfigDict(extra="forbid")
    turn_id: str
    role: Literal["user", "assistant"]
    speaker: str = ""
    content: str
    meta: dict[str, Any] = Field(default_factory=dict)


class RawSession(BaseModel):
    """One RoleMemo session."""

    model_config = ConfigDict(extra="forbid")
    session_id: str
    time: str | None = None
    filler: bool = False
    meta: dict[str, Any] = Field(default_factory=dict)
    turns: list[RawTurn]


class RawEvidence(BaseModel):
    """Where a core fragment was revealed."""

    model_config = ConfigDict(extra="forbid")
    session_id: str
    turn_id: str
    fragment: str = ""


class RawQuery(BaseModel):
    """One RoleMemo test query."""

    model_config = ConfigDict(extra="forbid")
    query_id: str
    question: str
    task_type: TaskType
    core_fragments: list[str] = Field(min_length=2, max_length=2)
    core_insight: str
    evidence: list[RawEvidence] = Field(default_factory=list)
    reference_answer: str | None = None
    time: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class RawRoleMemo(BaseModel):
    """A whole RoleMemo file."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["rolememo/1"]
    id: str | None = None
    persona: Persona
    user_id: str = "user"
    history: list[RawSession]
    queries: list[RawQuery] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)


def _new_id(value: str, seen: Container[str], file: str | Path, path: str, what: str) -> str:
    """Return ``value``; raise when ``seen`` holds it already (a ``what`` id is unique in the file)."""
    if value in seen:
        raise DatasetError(str(file), path, f"a {what} id unique in the file", repr(value))
    return value


def _check_references(raw: RawRoleMemo, file: str | Path) -> None:
    where: dict[str, str] = {}
    sessions: set[str] = set()
    for s_i, s in enumerate(raw.history):
        sessions.add(_new_id(s.session_id, sessions, file, f"$.history[{s_i}].session_id", "session"))
        for t_i, t in enumerate(s.turns):
            where[_new_id(t.turn_id, where, file, f"$.history[{s_i}].turns[{t_i}].turn_id", "turn")] = s.session_id
    seen: set[str] = set()
    for q_i, q in enumerate(raw.queries):
        seen.add(_new_id(q.query_id, seen, file, f"$.queries[{q_i}].query_id", "query"))
        for e_i, e in enumerate(q.evidence):
            if e.turn_id not in where:
                raise DatasetError(
                    str(file), f"$.queries[{q_i}].evidence[{e_i}].turn_id", "a turn_id of history", repr(e.turn_id)
                )
            if where[e.turn_id] != e.session_id:
                raise DatasetError(
                    str(file),
                    f"$.queries[{q_i}].evidence[{e_i}].session_id",
                    f"{where[e.turn_id]!r} (the session of turn {e.turn_id!r})",
                    repr(e.session_id),
                )


def parse_rolememo(data: Any, file: str | Path = "<rolememo>", *, limit_sessions: int | None = None) -> DatasetItem:
    """Validate raw RoleMemo data and map it onto a :class:`DatasetItem`."""
    raw = validate(RawRoleMemo, data, file)
    _check_references(raw, file)
    history = raw.history if limit_sessions is None else raw.history[:limit_sessions]
    sessions = [
        Session(
            id=s.session_id,
            time=s.time,
            filler=s.filler,
            meta=s.meta,
            turns=[Turn(id=t.turn_id, role=t.role, speaker=t.speaker, text=t.content, meta=t.meta) for t in s.turns],
        )
        for s in history
    ]
    kept = {s.id for s in sessions}
    queries = []
    for q in raw.queries:
        if any(e.session_id not in kept for e in q.evidence):
            continue  # its evidence lies beyond the prefix
        queries.append(
            Query(
                id=q.query_id,
                text=q.question,
                task_type=q.task_type,
                answer=q.reference_answer,
                time=q.time,
                gold=GoldEvidence(
                    facts=list(q.core_fragments),
                    insight=q.core_insight,
                    session_ids=unique([e.session_id for e in q.evidence]),
                    turn_ids=unique([e.turn_id for e in q.evidence]),
                ),
                meta={**q.meta, "evidence": [e.model_dump() for e in q.evidence]},
            )
        )
    dialogue = Dialogue(
        id=raw.id or Path(str(file)).stem,
        persona=raw.persona,
        user_id=raw.user_id,
        sessions=sessions,
        meta=raw.meta,
    )
    return DatasetItem(dialogue=dialogue, queries=queries)


def load_rolememo(path: str | Path, *, limit_sessions: int | None = None) -> Dataset:
    """Load a RoleMemo file or a folder of them as a :class:`Dataset`."""
    items = [parse_rolememo(read_json(f), f, limit_sessions=limit_sessions) for f in json_files(path)]
    return Dataset(name="rolememo", source=str(path), items=items)


def _evidence(query: Query, dialogue: Dialogue) -> list[dict[str, Any]]:
    if query.meta.get("evidence"):
        return [dict(e) for e in query.meta["evidence"]]
    session_of = {t.id: s.id for s in dialogue.sessions for t in s.turns}
    return [{"session_id": session_of.get(t, ""), "turn_id": t, "fragment": ""} for t in query.gold.turn_ids]


def rolememo_json(item: DatasetItem) -> dict[str, Any]:
    """Return the RoleMemo JSON object of one history and its queries."""
    d = item.dialogue
    if d.persona is None:
        raise ValueError(f"dialogue {d.id!r} has no persona; RoleMemo files need one (set dialogue.persona)")
    queries = []
    for q in item.queries:
        if q.task_type is None or q.gold.insight is None:
            raise ValueError(f"query {q.id!r} needs task_type and gold.insight to be written as RoleMemo")
        raw_q: dict[str, Any] = {
            "query_id": q.id,
            "question": q.text,
            "task_type": q.task_type,
            "core_fragments": list(q.gold.facts),
            "core_insight": q.gold.insight,
            "evidence": _evidence(q, d),
        }
        if q.answer is not None:
            raw_q["reference_answer"] = q.answer
        if q.time is not None:
            raw_q["time"] = q.time
        meta = {k: v for k, v in q.meta.items() if k != "evidence"}
        if meta:
            raw_q["meta"] = meta
        queries.append(raw_q)
    history = []
    for s in d.sessions:
        raw_s: dict[str, Any] = {"session_id": s.id, "time": s.time}
        if s.filler:
            raw_s["filler"] = True
        if s.meta:
            raw_s["meta"] = s.meta
        raw_s["turns"] = [
            {"turn_id": t.id, "role": t.role, "speaker": t.speaker, "content": t.text}
            | ({"meta": t.meta} if t.meta else {})
            for t in s.turns
        ]
        history.append(raw_s)
    return {
        "format": FORMAT,
        "id": d.id,
        "persona": d.persona.model_dump(exclude_none=True),
        "user_id": d.user_id,
        "history": history,
        "queries": queries,
        "meta": d.meta,
    }


def _file_name(dialogue_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", dialogue_id).strip("._") or "dialogue"


def dump_rolememo(data: DatasetItem | Dataset, path: str | Path) -> Path:
    """Write one item to a RoleMemo file, or a dataset to a folder of them; atomically, file by file."""
    path = Path(path)
    if isinstance(data, Dataset):
        path.mkdir(parents=True, exist_ok=True)
        payloads = [(path / f"{_file_name(it.dialogue.id)}.json", rolememo_json(it)) for it in data.items]
        names = [p for p, _ in payloads]
        if len(set(names)) != len(names):
            raise ValueError("two dialogues map to the same file name; give them distinct dialogue ids")
        for target, payload in payloads:  # everything is built and checked before anything is written
            parse_rolememo(payload, target)
        for target, payload in payloads:
            write_json_atomic(target, payload)
        return path
    payload = rolememo_json(data)
    parse_rolememo(payload, path)  # never write what we could not read back
    return write_json_atomic(path, payload)
