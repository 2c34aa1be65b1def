"""Pydantic data model: dialogues, memory items, writer updates, queries.

Pydantic lives at the boundaries only (files, stored values, LLM structured
output); graph state stays a ``TypedDict``.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TaskType = Literal[
    "Decision Guidance",
    "Interpretive Attribution",
    "Value Judgment",
    "Contradiction Revelation",
]
TASK_TYPES: tuple[TaskType, ...] = (
    "Decision Guidance",
    "Interpretive Attribution",
    "Value Judgment",
    "Contradiction Revelation",
)
MemoryKind = Literal["fact", "insight"]
Status = Literal["active", "superseded"]
Role = Literal["user", "assistant"]
OpName = Literal["ADD", "UPDATE", "DELETE"]
EMOTIONS: tuple[str, ...] = (
    "joy",
    "acceptance",
    "fear",
    "surprise",
    "sadness",
    "disgust",
    "anger",
    "anticipation",
)


def utcnow() -> datetime:
    """Return the current time, timezone-aware UTC."""
    return datetime.now(UTC)


def stable_id(*parts: object, prefix: str = "") -> str:
    """Return a deterministic 16-hex id from ``parts`` (same parts, same id)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:16]
    return f"{prefix}{digest}"


MAX_ID_CHARS = 200
MAX_ITEM_TEXT = 10_000
"""Characters a memory item's text may hold when it comes from outside (imports, tools, MCP)."""


def check_id(value: object, what: str = "id") -> str:
    """Return ``value`` as an id, or raise ValueError naming ``what`` — the one rule for persona, user and item ids on
    every path that builds a file name, a namespace or a lookup.

    An id is 1-200 printable characters, not ``.`` or ``..``, without ``/``, ``\\`` or control characters (so it
    never escapes a folder); ``*``, ``%`` and quotes are ordinary characters, matched literally everywhere.

    >>> check_id("Sophie_Dubois")
    'Sophie_Dubois'
    """
    text = value if isinstance(value, str) else ""
    bad = (
        "must be a string"
        if not isinstance(value, str)
        else "is empty"
        if not text
        else f"is longer than {MAX_ID_CHARS} characters"
        if len(text) > MAX_ID_CHARS
        else "is '.' or '..'"
        if text in (".", "..")
        else "holds '/' or '\\'"
        if "/" in text or "\\" in text
        else "holds a control character"
        if not text.isprintable()
        else ""
    )
    if bad:
        raise ValueError(f"{what} {text[:40]!r} {bad}; use printable characters without / or \\")
    return text


# --------------------------------------------------------------------------- dialogue


class Persona(BaseModel):
    """A role-play character. Free-form extra keys are kept in ``extra``.

    ``personality`` holds labels for personality-fidelity tests, as InCharacter
    writes them (``{"BFI": {"Extraversion": {"score": 4.0, "type": "H"}}}``, or
    ``{"MBTI": "INTJ"}``); it is never shown to the agent.
    """

    model_config = ConfigDict(extra="allow")

    id: str
    name: str
    description: str = ""
    core_values: list[str] = Field(default_factory=list)
    traits: list[str] = Field(default_factory=list)
    background: str = ""
    expertise: list[str] = Field(default_factory=list)
    goals: list[str] = Field(default_factory=list)
    user_profile: str | dict[str, Any] | None = None
    personality: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        return check_id(value, "persona id")

    def render(self) -> str:
        """Render the persona as prompt text."""
        lines = [f"Name: {self.name}"]
        if self.description:
            lines.append(f"Role: {self.description}")
        for label, values in (
            ("Core values", self.core_values),
            ("Traits", self.traits),
            ("Expertise", self.expertise),
            ("Goals", self.goals),
        ):
            if values:
                lines.append(f"{label}: {', '.join(values)}")
        if self.background:
            lines.append(f"Background: {self.background}")
        for key, value in (self.model_extra or {}).items():
            lines.append(f"{key.replace('_', ' ').capitalize()}: {value}")
        return "\n".join(lines)


class Turn(BaseModel):
    """One message of a dialogue."""

    id: str
    role: Role
    speaker: str = ""
    text: str
    is_query: bool = False
    query_id: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class MemoryPoint(BaseModel):
    """A gold memory point of a session (RealMem ``extracted_memory``)."""

    id: str
    type: str = ""
    content: str
    source_turn: int | None = None
    session_id: str | None = None


class Session(BaseModel):
    """A dated conversation made of turns."""

    id: str
    time: str | None = None
    turns: list[Turn] = Field(default_factory=list)
    memory_points: list[MemoryPoint] = Field(default_factory=list)
    filler: bool = False
    meta: dict[str, Any] = Field(default_factory=dict)


class Dialogue(BaseModel):
    """A persona's whole multi-session history with one user."""

    id: str
    persona: Persona | None = None
    user_id: str = "user"
    sessions: list[Session] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- memory


class SourceRef(BaseModel):
    """Where a memory item came from."""

    session_id: str | None = None
    turn_ids: list[str] = Field(default_factory=list)
    chunk_id: str | None = None


class MemoryItem(BaseModel):
    """A stored fact or insight (the store contract of DESIGN.md)."""

    id: str
    namespace: tuple[str, ...]
    kind: MemoryKind
    text: str
    source: SourceRef = Field(default_factory=SourceRef)
    event_time: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    grounding: list[str] = Field(default_factory=list)
    emotion: list[float] | None = None
    status: Status = "active"
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("emotion")
    @classmethod
    def _eight_emotions(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and len(value) != len(EMOTIONS):
            raise ValueError(f"emotion needs {len(EMOTIONS)} values {EMOTIONS}, got {len(value)}")
        return value


class Fact(MemoryItem):
    """An objective event the user revealed."""

    kind: Literal["fact"] = "fact"


class Insight(MemoryItem):
    """The persona's interpretation of facts, grounded in fact ids."""

    kind: Literal["insight"] = "insight"

    @model_validator(mode="after")
    def _grounded(self) -> Insight:
        if not self.grounding:
            raise ValueError("an insight must cite at least one fact id in `grounding`")
        return self


# --------------------------------------------------------------------------- writer output


class FactOp(BaseModel):
    """One operation on the fact stream.

    ``ADD`` takes a new label (``N1``, ``N2`` …) that insights of the same update
    may cite; ``UPDATE`` / ``DELETE`` take an id shown in the working view (``F3``).
    """

    model_config = ConfigDict(extra="forbid")  # an unknown key is an error to repair, never ignored

    op: OpName
    id: str = Field(
        description="new label N1, N2… for ADD; a view id like F3 for UPDATE/DELETE", pattern=r"^[NF][0-9]{1,3}$"
    )
    text: str = Field(default="", description="the fact, one short sentence (empty for DELETE)", max_length=300)
    turn_ids: list[str] = Field(default_factory=list, description="ids of the turns it comes from")


class InsightOp(BaseModel):
    """One operation on the insight stream; ``fact_ids`` cite view or new fact labels."""

    model_config = ConfigDict(extra="forbid")

    op: OpName
    id: str = Field(
        description="new label M1, M2… for ADD; a view id like I2 for UPDATE/DELETE", pattern=r"^[MI][0-9]{1,3}$"
    )
    text: str = Field(default="", description="the persona's interpretation (empty for DELETE)", max_length=500)
    fact_ids: list[Annotated[str, Field(pattern=r"^[NF][0-9]{1,3}$")]] = Field(
        default_factory=list, description="fact ids it rests on: view ids (F3) or new labels (N1)"
    )


class MemoryUpdate(BaseModel):
    """The writer model's answer for one chunk: fact and insight operations, nothing else."""

    # strict: {"memories": [...]} does not validate, so it is repaired or the chunk is recorded as failed,
    # never taken for an empty update
    model_config = ConfigDict(extra="forbid")

    facts: list[FactOp] = Field(default_factory=list)
    insights: list[InsightOp] = Field(default_factory=list)


# --------------------------------------------------------------------------- evaluation


class GoldEvidence(BaseModel):
    """What a correct memory must hold to answer a query."""

    facts: list[str] = Field(default_factory=list)
    insight: str | None = None
    session_ids: list[str] = Field(default_factory=list)
    turn_ids: list[str] = Field(default_factory=list)
    memory_points: list[str] = Field(default_factory=list)


class Query(BaseModel):
    """A test question with its gold evidence."""

    id: str
    text: str
    task_type: TaskType | None = None
    category: str | None = None
    answer: str | None = None
    gold: GoldEvidence = Field(default_factory=GoldEvidence)
    session_id: str | None = None
    turn_index: int | None = None
    time: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class DatasetItem(BaseModel):
    """One history and the queries asked about it."""

    dialogue: Dialogue
    queries: list[Query] = Field(default_factory=list)


class Dataset(BaseModel):
    """A loaded benchmark: several histories with their queries."""

    name: str
    source: str = ""
    items: list[DatasetItem] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)


__all__ = [
    "EMOTIONS",
    "MAX_ID_CHARS",
    "MAX_ITEM_TEXT",
    "TASK_TYPES",
    "Dataset",
    "DatasetItem",
    "Dialogue",
    "Fact",
    "FactOp",
    "GoldEvidence",
    "Insight",
    "InsightOp",
    "MemoryItem",
    "MemoryKind",
    "MemoryPoint",
    "MemoryUpdate",
    "Persona",
    "Query",
    "Session",
    "SourceRef",
    "Turn",
    "check_id",
    "stable_id",
    "utcnow",
]
