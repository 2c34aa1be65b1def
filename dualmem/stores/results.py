"""What a search of the dual store returns: scored items, and facts plus insights with their grounding."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualmem.schema import MemoryItem


@dataclass
class ScoredItem:
    """A memory item with its search score (higher is better)."""

    item: MemoryItem
    score: float


@dataclass
class DualResult:
    """Facts and insights for one query; each insight expanded with the facts it cites."""

    facts: list[ScoredItem] = field(default_factory=list)
    insights: list[ScoredItem] = field(default_factory=list)
    grounding: dict[str, list[MemoryItem]] = field(default_factory=dict)
    merged: list[ScoredItem] = field(default_factory=list)
