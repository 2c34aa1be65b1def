"""RealMem loader and writer (``<Name>_dialogues_256k.json``, github AvatarMemory/RealMemBench).

Raw format::

    {"_metadata": {"person_name": str, "total_sessions": int, "total_tokens": int},
     "dialogues": [{"session_identifier": str, "session_uuid": str, "current_time": str,
                    "dialogue_turns": [{"speaker": "User"|"Assistant", "content": str,
                                        "is_query": bool, "query_id": str|null,
                                        # query user turns: "topic", "category_name", "session_type"
                                        # the assistant turn after a query:
                                        "memory_used": [{"session_uuid", "content"}],
                                        "memory_session_uuids": [str]}],
                    "extracted_memory": [{"index", "type", "content", "source_turn", "session_uuid", ...}]}]}

Mapping: one :class:`DatasetItem` per file; sessions in file order (``id`` =
``session_uuid``, ``time`` = ``current_time``, ``filler`` for ``Enhanced:*``
sessions, ``meta.session_identifier``); turn ids are ``<session_uuid>:<index>``;
extra raw turn keys (``topic``, ``memory_used`` …) are kept in ``Turn.meta``.
Each ``is_query`` user turn becomes a :class:`Query` whose gold sessions are the
``memory_session_uuids`` of the next assistant turn, gold memory points the
``memory_used`` contents, and answer that assistant reply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dualmem.datasets._validate import json_files, read_json, validate, write_json_atomic
from dualmem.errors import DatasetError
from dualmem.models.tokens import count_tokens_batch
from dualmem.schema import Dataset, DatasetItem, Dialogue, GoldEvidence, MemoryPoint, Persona, Query, Session, Turn

TURN_KEYS = {"speaker", "content", "is_query", "query_id"}


class RawMemoryUsed(BaseModel):
    """A memory point an assistant reply used."""

    model_config = ConfigDict(extra="allow")
    session_uuid: str
    content: str


class RawTurn(BaseModel):
    """One RealMem dialogue turn."""

    model_config = ConfigDict(extra="allow")
    speaker: Literal["User", "Assistant"]
    content: str
    is_query: bool = False
    query_id: str | None = None
    category_name: str | None = None
    memory_used: list[RawMemoryUsed] | None = None
    memory_session_uuids: list[str] | None = None


class RawMemory(BaseModel):
    """One extracted memory point of a session."""

    model_config = ConfigDict(extra="allow")
    index: str
    type: str = ""
    content: str | dict[str, Any] | list[Any]
    source_turn: int | None = None
    session_uuid: str | None = None


class RawSession(BaseModel):
    """One RealMem session."""

    model_config = ConfigDict(extra="allow")
    session_identifier: str
    session_uuid: str
    current_time: str | None = None
    dialogue_turns: list[RawTurn]
    extracted_memory: list[RawMemory] = Field(default_factory=list)


class RawMetadata(BaseModel):
    """The ``_metadata`` block."""

    model_config = ConfigDict(extra="allow")
    person_name: str


class RawFile(BaseModel):
    """A whole RealMem file."""

    model_config = ConfigDict(extra="allow")
    metadata: RawMetadata = Field(alias="_metadata")
    dialogues: list[RawSession]


def _text(content: str | dict[str, Any] | list[Any]) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, sort_keys=True)


def _turn(raw_turn: dict[str, Any], turn: RawTurn, session_id: str, index: int) -> Turn:
    meta = {k: v for k, v in raw_turn.items() if k not in TURN_KEYS}
    return Turn(
        id=f"{session_id}:{index}",
        role="user" if turn.speaker == "User" else "assistant",
        speaker=turn.speaker,
        text=turn.content,
        is_query=turn.is_query,
        query_id=turn.query_id,
        meta=meta,
    )


def _queries(session: Session) -> list[Query]:
    out = []
    for i, turn in enumerate(session.turns):
        if not (turn.is_query and turn.role == "user"):
            continue
        reply = next((t for t in session.turns[i + 1 :] if t.role == "assistant"), None)
        used = (reply.meta.get("memory_used") if reply else None) or []
        out.append(
            Query(
                id=turn.query_id or f"{session.id}:q{i}",
                text=turn.text,
                category=turn.meta.get("category_name"),
                answer=reply.text if reply else None,
                gold=GoldEvidence(
                    session_ids=list((reply.meta.get("memory_session_uuids") if reply else None) or []),
                    memory_points=[m["content"] for m in used],
                ),
                session_id=session.id,
                turn_index=i,
                time=session.time,
                meta={k: turn.meta[k] for k in ("topic", "session_type") if k in turn.meta} | {"memory_used": used},
            )
        )
    return out


def parse_realmem(data: Any, file: str | Path = "<realmem>", *, limit_sessions: int | None = None) -> DatasetItem:
    """Validate raw RealMem JSON data and map it onto a :class:`DatasetItem`."""
    raw = validate(RawFile, data, file)
    first: dict[str, int] = {}
    for i, rs in enumerate(raw.dialogues):  # a repeated uuid would merge two sessions (and their turn ids) into one
        if rs.session_uuid in first:
            raise DatasetError(
                str(file),
                f"$.dialogues[{i}].session_uuid",
                f"a session_uuid not used by an earlier session (first used at $.dialogues[{first[rs.session_uuid]}])",
                f"{rs.session_uuid!r} again; give each session its own uuid",
            )
        first[rs.session_uuid] = i
    name = raw.metadata.person_name
    sessions: list[Session] = []
    raw_sessions = raw.dialogues if limit_sessions is None else raw.dialogues[:limit_sessions]
    for s_index, rs in enumerate(raw_sessions):
        raw_turns = data["dialogues"][s_index]["dialogue_turns"]
        turns = [_turn(raw_turns[i], t, rs.session_uuid, i) for i, t in enumerate(rs.dialogue_turns)]
        points = [
            MemoryPoint(
                id=m.index, type=m.type, content=_text(m.content), source_turn=m.source_turn, session_id=m.session_uuid
            )
            for m in rs.extracted_memory
        ]
        sessions.append(
            Session(
                id=rs.session_uuid,
                time=rs.current_time,
                turns=turns,
                memory_points=points,
                filler=rs.session_identifier.startswith("Enhanced"),
                meta={"session_identifier": rs.session_identifier},
            )
        )
    meta = {k: v for k, v in data["_metadata"].items() if k != "person_name"}
    persona = Persona(id=name, name=name.replace("_", " "))
    dialogue = Dialogue(id=name, persona=persona, user_id="user", sessions=sessions, meta=meta)
    return DatasetItem(dialogue=dialogue, queries=[q for s in sessions for q in _queries(s)])


def load_realmem(path: str | Path, *, limit_sessions: int | None = None) -> Dataset:
    """Load a RealMem file, or every ``*_dialogues_*.json`` of a folder, as a :class:`Dataset`."""
    files = json_files(path, "*_dialogues_*.json")
    items = [parse_realmem(read_json(f), f, limit_sessions=limit_sessions) for f in files]
    return Dataset(name="realmem", source=str(path), items=items)


def _raw_turns(session: Session, queries: dict[tuple[str, int], Query]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: Query | None = None
    for i, turn in enumerate(session.turns):
        raw: dict[str, Any] = {
            "speaker": "User" if turn.role == "user" else "Assistant",
            "is_query": turn.is_query,
            "content": turn.text,
            "query_id": turn.query_id,
        }
        raw.update({k: v for k, v in turn.meta.items() if k not in TURN_KEYS})
        query = queries.get((session.id, i))
        if query is not None and turn.role == "user":
            raw.update(is_query=True, query_id=query.id)
            if query.category is not None:
                raw["category_name"] = query.category
            for key in ("topic", "session_type"):
                if key in query.meta:
                    raw[key] = query.meta[key]
            pending = query
        elif pending is not None and turn.role == "assistant":
            used = pending.meta.get("memory_used") or [
                {
                    "session_uuid": pending.gold.session_ids[0] if len(pending.gold.session_ids) == 1 else "",
                    "content": c,
                }
                for c in pending.gold.memory_points
            ]
            raw.update(memory_used=used, memory_session_uuids=list(pending.gold.session_ids))
            pending = None
        out.append(raw)
    return out


def _raw_memory(point: MemoryPoint, session: Session) -> dict[str, Any]:
    """Return a memory point as RealMem writes it; ``source_turn`` is 1-based there, so the snapshot is that turn's text."""
    raw: dict[str, Any] = {
        "index": point.id,
        "type": point.type,
        "content": point.content,
        "source_turn": point.source_turn,
    }
    if point.source_turn is not None and 0 < point.source_turn <= len(session.turns):
        turn = session.turns[point.source_turn - 1]
        raw["source_content_snapshot"] = turn.text
        raw["source_role_snapshot"] = "User" if turn.role == "user" else "Assistant"
    raw["session_uuid"] = point.session_id or session.id
    return raw


def realmem_json(dialogue: Dialogue, queries: list[Query] | None = None) -> dict[str, Any]:
    """Return the RealMem JSON object of a dialogue and its queries."""
    by_turn: dict[tuple[str, int], Query] = {}
    for q in queries or []:
        if q.session_id is None or q.turn_index is None:
            raise ValueError(f"query {q.id!r} needs session_id and turn_index to be written in RealMem format")
        by_turn[(q.session_id, q.turn_index)] = q
    sessions = []
    for s in dialogue.sessions:
        sessions.append(
            {
                "session_identifier": s.meta.get("session_identifier") or (f"Enhanced:{s.id}" if s.filler else s.id),
                "session_uuid": s.id,
                "current_time": s.time,
                "dialogue_turns": _raw_turns(s, by_turn),
                "extracted_memory": [_raw_memory(m, s) for m in s.memory_points],
            }
        )
    name = dialogue.persona.id if dialogue.persona else dialogue.id
    meta = dict(dialogue.meta)
    meta.setdefault("total_sessions", len(sessions))
    if "total_tokens" not in meta:
        meta["total_tokens"] = sum(count_tokens_batch([t.text for s in dialogue.sessions for t in s.turns]))
    return {"_metadata": {"person_name": name, **meta}, "dialogues": sessions}


def dump_realmem(dialogue: Dialogue | DatasetItem, queries: list[Query] | None = None, path: str | Path = "") -> Path:
    """Write a dialogue and its queries as a RealMem JSON file, atomically."""
    if isinstance(dialogue, DatasetItem):
        queries = dialogue.queries if queries is None else queries
        dialogue = dialogue.dialogue
    if not path:
        raise ValueError("dump_realmem needs a target path")
    data = realmem_json(dialogue, queries)
    parse_realmem(data, path)  # never write what we could not read back
    return write_json_atomic(path, data)
