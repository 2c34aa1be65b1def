"""LoCoMo loader (``locomo10.json``, snap-research; copy of WujiangXu/AgenticMemory).

Raw format: a list of conversations::

    [{"sample_id": "conv-26",
      "conversation": {"speaker_a": str, "speaker_b": str,
                       "session_<N>_date_time": str,
                       "session_<N>": [{"speaker": str, "dia_id": "D<N>:<i>", "text": str,
                                        "blip_caption"?: str, "img_url"?: [str], "query"?: str}]},
      "qa": [{"question": str, "answer"|"adversarial_answer": str|int,
              "evidence": ["D<N>:<i>", ...], "category": 1-5}],
      "observation": {"session_<N>_observation": {speaker: [[text, dia_id], ...]}},
      "session_summary": {"session_<N>_summary": str}, "event_summary": {...}}]

Mapping: one :class:`DatasetItem` per conversation (dialogue id = ``sample_id``).
LoCoMo is a chat between two peers; we map ``speaker_a`` to role ``user`` and
``speaker_b`` to role ``assistant`` (the persona is speaker_b, the user id
speaker_a), so that a memory framework remembers what speaker_a revealed the
same way it does for a user. Speaker names stay in ``Turn.speaker``. Sessions
are ``session_<N>`` (the raw key) with ``time`` = ``session_<N>_date_time``;
turn ids are the ``dia_id`` (``D1:3``); a shared image's ``blip_caption`` is
appended to the text as ``[shares a photo: …]``. Observations become the
sessions' memory points. Queries come from ``qa``: ``category`` as a string,
``answer`` (or ``adversarial_answer`` for category 5), ``gold.turn_ids`` the
evidence ids and ``gold.session_ids`` their ``D<N>`` prefixes. Malformed
evidence ids of the real file (``"D8:6; D9:17"``, ``"D:11:26"``, ``"D30:05"``)
are split and normalised (the raw strings listed in ``Query.meta["evidence_fixed"]``);
ids that name no turn are dropped and listed in ``Query.meta["evidence_missing"]``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dualmem.datasets._validate import describe, json_files, read_json, unique, validate
from dualmem.errors import DatasetError
from dualmem.schema import Dataset, DatasetItem, Dialogue, GoldEvidence, MemoryPoint, Persona, Query, Session, Turn

SESSION_KEY = re.compile(r"^session_(\d+)$")
EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


class RawTurn(BaseModel):
    """One LoCoMo turn."""

    model_config = ConfigDict(extra="allow")
    speaker: str
    dia_id: str
    text: str
    blip_caption: str | None = None


class RawQA(BaseModel):
    """One LoCoMo question."""

    model_config = ConfigDict(extra="allow")
    question: str
    answer: Any = None
    adversarial_answer: str | None = None
    evidence: list[str] = Field(default_factory=list)
    category: int


class RawConversationHead(BaseModel):
    """The fixed keys of ``conversation`` (sessions are validated one by one)."""

    model_config = ConfigDict(extra="allow")
    speaker_a: str
    speaker_b: str


class RawSample(BaseModel):
    """One LoCoMo conversation with its questions."""

    model_config = ConfigDict(extra="allow")
    sample_id: str
    conversation: dict[str, Any]
    qa: list[RawQA] = Field(default_factory=list)
    observation: dict[str, Any] = Field(default_factory=dict)


TURNS = TypeAdapter(list[RawTurn])
SAMPLES = TypeAdapter(list[dict[str, Any]])


def normalise_evidence(raw: str) -> list[str]:
    """Split one raw evidence string into clean ``D<N>:<i>`` ids (``"D8:6; D9:17"`` -> two ids)."""
    return [f"D{int(s)}:{int(t)}" for s, t in EVIDENCE_ID.findall(raw)]


def session_of(turn_id: str) -> str:
    """Return the session id (``session_<N>``) of a ``D<N>:<i>`` turn id."""
    return f"session_{int(turn_id[1:].split(':', 1)[0])}"


def _text(turn: RawTurn) -> str:
    return f"{turn.text} [shares a photo: {turn.blip_caption}]" if turn.blip_caption else turn.text


def _observations(raw: dict[str, Any], n: int, session_id: str) -> list[MemoryPoint]:
    block = raw.get(f"session_{n}_observation") or {}
    points: list[MemoryPoint] = []
    if not isinstance(block, dict):
        return points
    for speaker, rows in block.items():
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, list) and row and isinstance(row[0], str):
                source = row[1] if len(row) > 1 and isinstance(row[1], str) else ""
                ids = normalise_evidence(source)
                points.append(
                    MemoryPoint(
                        id=f"{session_id}:obs{len(points)}",
                        type=speaker,
                        content=row[0],
                        source_turn=int(ids[0].split(":")[1]) if ids else None,
                        session_id=session_id,
                    )
                )
    return points


def parse_locomo_sample(
    data: Any, file: str | Path = "<locomo>", index: int = 0, *, limit_sessions: int | None = None
) -> DatasetItem:
    """Validate one raw LoCoMo conversation and map it onto a :class:`DatasetItem`."""
    root: tuple[Any, ...] = (index,)
    raw = validate(RawSample, data, file, root)
    conv = raw.conversation
    head = validate(RawConversationHead, conv, file, (*root, "conversation"))
    numbers = sorted(int(m.group(1)) for key in conv if (m := SESSION_KEY.match(key)))
    if limit_sessions is not None:
        numbers = numbers[:limit_sessions]
    roles = {head.speaker_a: "user", head.speaker_b: "assistant"}
    sessions: list[Session] = []
    seen_ids: dict[str, str] = {}
    for n in numbers:
        key = f"session_{n}"
        turns_raw = validate(TURNS, conv[key], file, (*root, "conversation", key))
        turns = []
        for t_index, t in enumerate(turns_raw):
            if t.dia_id in seen_ids:
                raise DatasetError(
                    str(file),
                    f"$[{index}].conversation.{key}[{t_index}].dia_id",
                    f"a dia_id not used by an earlier turn (first at {seen_ids[t.dia_id]})",
                    f"{t.dia_id!r} again",
                )
            seen_ids[t.dia_id] = f"$[{index}].conversation.{key}[{t_index}]"
            if t.speaker not in roles:
                raise DatasetError(
                    str(file),
                    f"$[{index}].conversation.{key}[{t_index}].speaker",
                    f"{head.speaker_a!r} or {head.speaker_b!r}",
                    repr(t.speaker),
                )
            extra = {k: v for k, v in conv[key][t_index].items() if k not in {"speaker", "dia_id", "text"}}
            turns.append(Turn(id=t.dia_id, role=roles[t.speaker], speaker=t.speaker, text=_text(t), meta=extra))  # type: ignore[arg-type]
        time = conv.get(f"{key}_date_time")
        if time is not None and not isinstance(time, str):
            raise DatasetError(
                str(file),
                f"$[{index}].conversation.{key}_date_time",
                "a date string like '1:56 pm on 8 May, 2023'",
                describe(time),
            )
        sessions.append(
            Session(id=key, time=time, turns=turns, memory_points=_observations(raw.observation, n, key), meta={"n": n})
        )
    turn_ids = {t.id for s in sessions for t in s.turns}
    kept = {s.id for s in sessions}
    queries: list[Query] = []
    for q_index, qa in enumerate(raw.qa):
        ids: list[str] = unique([i for e in qa.evidence for i in normalise_evidence(e)])
        good = [i for i in ids if i in turn_ids]
        if limit_sessions is not None and any(session_of(i) not in kept for i in ids):
            continue  # its evidence lies beyond the prefix
        answer = qa.adversarial_answer if qa.category == 5 and qa.adversarial_answer is not None else qa.answer
        meta: dict[str, Any] = {"evidence": list(qa.evidence)}
        if fixed := [e for e in qa.evidence if normalise_evidence(e) != [e]]:
            meta["evidence_fixed"] = fixed
        if missing := [i for i in ids if i not in turn_ids]:
            meta["evidence_missing"] = missing
        queries.append(
            Query(
                id=f"{raw.sample_id}:q{q_index}",
                text=qa.question,
                category=str(qa.category),
                answer=None if answer is None else str(answer),
                gold=GoldEvidence(turn_ids=good, session_ids=unique([session_of(i) for i in good])),
                meta=meta,
            )
        )
    persona = Persona(id=head.speaker_b, name=head.speaker_b, description=f"speaker_b of LoCoMo {raw.sample_id}")
    dialogue = Dialogue(
        id=raw.sample_id,
        persona=persona,
        user_id=f"{raw.sample_id}:{head.speaker_a}",  # speaker_a in this conversation: one namespace each
        sessions=sessions,
        meta={"speaker_a": head.speaker_a, "speaker_b": head.speaker_b},
    )
    return DatasetItem(dialogue=dialogue, queries=queries)


def load_locomo(path: str | Path, *, limit_sessions: int | None = None, limit_items: int | None = None) -> Dataset:
    """Load ``locomo10.json`` (or every ``*.json`` LoCoMo file of a folder) as a :class:`Dataset`."""
    items: list[DatasetItem] = []
    for file in json_files(path):
        data = read_json(file)
        if isinstance(data, dict):  # a single conversation
            data = [data]
        samples = validate(SAMPLES, data, file)
        for i, sample in enumerate(samples[:limit_items] if limit_items else samples):
            items.append(parse_locomo_sample(sample, file, i, limit_sessions=limit_sessions))
    return Dataset(name="locomo", source=str(path), items=items)
