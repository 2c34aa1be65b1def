"""``full-context``: no memory at all — the last N tokens of the history go into the prompt.

Every turn is kept verbatim as a record of the framework's space
(:class:`~dualmem.frameworks.kit.Space`, ``{uri}/full-context``), so ingest is
incremental, exactly once per session and survives restarts. The window is
the newest turns whose rendered lines fit in ``max_tokens`` tokens (default
``settings.evaluation.context_tokens``, counted with :func:`dualmem.models.tokens.count_tokens`);
a single turn longer than the window is cut to its last tokens.

``retrieve(query, k)`` ignores the query: it returns the ``k`` newest turns of
the window, **newest first** (score 1.0 for the newest, decreasing), kind
``"turn"`` (as ``raw-turns``), ``id`` the turn id, ``meta`` with role and turn
id. ``respond`` puts the *whole* window, oldest first, into the shared reader
prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.frameworks.kit import Space, render_turn, truncate_tokens
from dualmem.models.tokens import count_tokens_batch
from dualmem.schema import Session


class FullContextFramework(MemoryFramework):
    """Keep no memory: answer from the last ``max_tokens`` tokens of the raw history."""

    name = "full-context"
    description = "no memory: the last context_tokens tokens of the history in the prompt"

    def __init__(self, context: FrameworkContext, max_tokens: int | None = None) -> None:
        super().__init__(context)
        self.max_tokens = int(max_tokens or context.settings.evaluation.context_tokens)
        self.space = Space(context, self.name)
        self.namespace = tuple(context.namespace)

    def ingest(self, session: Session) -> IngestReport:
        """Store the session's turns verbatim (once: re-ingesting a session does nothing)."""
        return self.space.ingest_once(session.id, lambda report: self._ingest(session, report))

    def _ingest(self, session: Session, report: IngestReport) -> None:
        lines = [render_turn(t, session.time) for t in session.turns]
        sizes = count_tokens_batch(lines) if lines else []
        start = self.space.count()
        turns = [
            {
                "id": f"{session.id}/{t.id}",
                "turn_id": t.id,
                "session": session.id,
                "time": session.time,
                "role": t.role,
                "line": line,
                "tokens": size,
                "seq": start + i,
            }
            for i, (t, line, size) in enumerate(zip(session.turns, lines, sizes, strict=True))
        ]
        self.space.put(turns, lines, embed=False)  # never searched by meaning
        report.items_written = len(turns)

    def window(self) -> list[RetrievedItem]:
        """Return the turns inside the token window, oldest first."""
        turns = sorted(self.space.records(), key=lambda r: r["seq"])
        out: list[RetrievedItem] = []
        used = 0
        for turn in reversed(turns):
            size = turn["tokens"]
            if used + size > self.max_tokens:
                if not out:  # the newest turn alone is too long: keep its end
                    out.append(
                        self._item(turn, truncate_tokens(turn["line"], self.max_tokens, keep="end"), truncated=True)
                    )
                break
            out.append(self._item(turn, turn["line"]))
            used += size
        for rank, item in enumerate(out):
            item.score = 1.0 / (rank + 1)
        return out[::-1]

    @staticmethod
    def _item(turn: dict[str, Any], text: str, truncated: bool = False) -> RetrievedItem:
        meta = {"unit": "turn", "role": turn["role"], "turn_id": turn["turn_id"], "truncated": truncated}
        return RetrievedItem(
            text=text, kind="turn", score=0.0, source_session=turn["session"], id=turn["turn_id"], meta=meta
        )

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[str] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` newest turns of the window, newest first (the query is ignored)."""
        return self.window()[::-1][:k]

    def respond(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> str:
        """Answer from the whole window (oldest first), whatever ``k``."""
        from dualmem.frameworks.base import answer_from_items

        return answer_from_items(self.context, query, self.window())

    def reset(self) -> None:
        """Forget every stored session of this namespace."""
        self.space.drop()
