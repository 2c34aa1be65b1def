"""What a writer call did: one report row per chunk of the history, and the figures users ask for."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WriteReport:
    """What a writer call did, one row per chunk of the history (``skipped`` = applied before)."""

    namespace: tuple[str, ...]
    chunks: list[dict[str, Any]] = field(default_factory=list)
    failed_chunks: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] = field(
        default_factory=dict
    )  # its model calls, when counted (``dualmem ingest``: dualmem.evals.cost)
    lease_wait_s: float = 0.0  # seconds the writer waited for other writers of the namespace before writing

    def _ops(self, stream: str) -> int:
        return sum(
            1
            for row in self.chunks
            if row.get("status") == "applied"
            for op in row.get("applied") or []
            if op["stream"] == stream and op["op"] in ("ADD", "UPDATE")
        )

    @property
    def facts_written(self) -> int:
        """Return the facts added or updated."""
        return self._ops("fact")

    @property
    def insights_written(self) -> int:
        """Return the insights added or updated."""
        return self._ops("insight")

    @property
    def rejected(self) -> int:
        """Return the operations rejected by validation."""
        return sum(len(row.get("rejected") or []) for row in self.chunks)

    @property
    def flagged_turns(self) -> list[dict[str, Any]]:
        """Return the turns the guard flagged as requests to change the persona's memory (once each)."""
        seen: dict[str, dict[str, Any]] = {}
        for row in self.chunks:
            for flag in row.get("flagged") or []:
                seen.setdefault(flag["turn_id"], flag)
        return list(seen.values())

    @property
    def guard_rejected(self) -> int:
        """Return the operations the memory-poisoning guard rejected."""
        return sum(
            1
            for row in self.chunks
            for op in row.get("rejected") or []
            if str(op.get("reason", "")).startswith("guard:")
        )

    @property
    def request_facts(self) -> int:
        """Return the facts kept as requests to change the persona's memory (what the user asked)."""
        return sum(
            1
            for row in self.chunks
            if row.get("status") == "applied"
            for op in row.get("applied") or []
            if op.get("request")
        )

    @property
    def llm_calls(self) -> int:
        """Return the writer model calls (repairs included)."""
        return sum(int(row.get("attempts") or 0) for row in self.chunks)

    @property
    def prompt_tokens(self) -> list[int]:
        """Return the prompt size of every drafted chunk, in chunk order."""
        return [int(row["prompt_tokens"]) for row in self.chunks if row.get("prompt_tokens")]

    def summary(self) -> str:
        """Return a one-line summary."""
        return (
            f"{len(self.chunks)} chunks, {self.facts_written} facts and {self.insights_written} insights written, "
            f"{self.rejected} ops rejected, {len(self.failed_chunks)} chunk(s) failed, {self.llm_calls} model calls, "
            f"{len(self.flagged_turns)} turn(s) flagged as requests to change the persona's memory "
            f"({self.request_facts} kept as request facts, {self.guard_rejected} ops rejected by the guard)"
        )


def failed_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the failed chunks of report rows (id, index, error, attempts)."""
    keys = ("chunk_id", "index", "error", "attempts")
    return [{k: r.get(k) for k in keys} for r in rows if r.get("status") == "failed"]
