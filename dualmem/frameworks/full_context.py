"""``full-context``: no memory at all — the last N tokens of the history go into the prompt.

Sessions are kept verbatim in a small LanceDB table (``{uri}/full-context``), one
row per session, so ingest is incremental, idempotent (re-ingesting a session
replaces it) and survives restarts. The window is the newest turns whose
rendered lines fit in ``max_tokens`` tokens (default ``settings.context_tokens``, counted with
:func:`dualmem.tokens.count_tokens`); a single turn longer than the window is
cut to its last tokens.

``retrieve(query, k)`` ignores the query: it returns the ``k`` newest turns of
the window, **newest first** (score 1.0 for the newest, decreasing), kind
``"turn"`` (as ``raw-turns``), ``id`` the turn id, ``meta`` with role and turn
id. ``respond`` puts the *whole* window, oldest first, into the shared reader
prompt.

This module also holds helpers the other baselines share: :class:`LanceState`
(JSON values by key in a LanceDB table), :func:`truncate_tokens`,
:func:`render_turn` and :func:`session_chunks`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import lancedb
import pyarrow as pa

from dualmem.frameworks.base import FrameworkContext, IngestReport, MemoryFramework, RetrievedItem
from dualmem.schema import Session, Turn
from dualmem.tokens import count_tokens, count_tokens_batch

_STATE_SCHEMA = pa.schema(
    [("pk", pa.string()), ("ns", pa.string()), ("key", pa.string()), ("value", pa.string()), ("seq", pa.int64())]
)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class LanceState:
    """Keep JSON values by (namespace, key) in one LanceDB table, ordered by insertion."""

    def __init__(self, uri: str, table: str = "framework_state") -> None:
        self.db = lancedb.connect(uri)
        self.table = self.db.create_table(table, schema=_STATE_SCHEMA, exist_ok=True)

    @staticmethod
    def _ns(namespace: tuple[str, ...]) -> str:
        return "\x1f".join(namespace)

    def _rows(self, namespace: tuple[str, ...], key: str | None = None) -> list[dict[str, Any]]:
        where = f"ns = {_quote(self._ns(namespace))}"
        if key is not None:
            where += f" AND key = {_quote(key)}"
        rows = self.table.search().where(where).limit(None).to_list()
        return sorted(rows, key=lambda r: r["seq"])

    def get(self, namespace: tuple[str, ...], key: str, default: Any = None) -> Any:
        """Return the value stored under ``key`` (``default`` when absent)."""
        rows = self._rows(namespace, key)
        return json.loads(rows[0]["value"]) if rows else default

    def put(self, namespace: tuple[str, ...], values: dict[str, Any]) -> None:
        """Store several values; a replaced key keeps its position in the order."""
        if not values:
            return
        ns = self._ns(namespace)
        old = {r["key"]: r["seq"] for r in self._rows(namespace)}
        nxt = max(old.values(), default=-1) + 1
        rows = []
        for key, value in values.items():
            seq = old.get(key)
            if seq is None:
                seq, nxt = nxt, nxt + 1
            rows.append({"pk": f"{ns}\x1e{key}", "ns": ns, "key": key, "value": json.dumps(value), "seq": seq})
        self.table.merge_insert("pk").when_matched_update_all().when_not_matched_insert_all().execute(rows)

    def items(self, namespace: tuple[str, ...], prefix: str = "") -> list[tuple[str, Any]]:
        """Return ``(key, value)`` pairs whose key starts with ``prefix``, oldest first."""
        return [(r["key"], json.loads(r["value"])) for r in self._rows(namespace) if r["key"].startswith(prefix)]

    def drop(self, namespace: tuple[str, ...]) -> None:
        """Delete every value of ``namespace``."""
        self.table.delete(f"ns = {_quote(self._ns(namespace))}")


def truncate_tokens(text: str, limit: int, keep: str = "start") -> str:
    """Cut ``text`` to at most ``limit`` tokens at a word boundary, keeping its start or end."""
    if limit <= 0:
        return ""
    if count_tokens(text) <= limit:
        return text
    words = text.split()
    lo, hi = 0, len(words)  # largest n words that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        part = words[:mid] if keep == "start" else words[len(words) - mid :]
        if count_tokens(" ".join(part)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    part = words[:lo] if keep == "start" else words[len(words) - lo :]
    return " ".join(part)


def render_turn(turn: Turn, time: str | None = None) -> str:
    """Render one turn as a transcript line."""
    who = turn.speaker or turn.role
    stamp = f"[{time}] " if time else ""
    return f"{stamp}{who}: {turn.text}"


def _split_turn(turn: Turn, max_tokens: int) -> list[Turn]:
    """Split an over-long turn into parts ``ID#p0``, ``ID#p1``… that each fit ``max_tokens``."""
    parts, rest, j = [], turn.text, 0
    while rest:
        piece = truncate_tokens(rest, max(max_tokens - 8, 1)) or rest.split()[0]
        parts.append(turn.model_copy(update={"id": f"{turn.id}#p{j}", "text": piece}))
        rest = rest.split(None, len(piece.split()))[-1] if len(rest.split()) > len(piece.split()) else ""
        j += 1
    return parts


def session_chunks(session: Session, max_tokens: int) -> list[list[Turn]]:
    """Split a session into runs of whole turns of at most ``max_tokens`` tokens (longer turns are split)."""
    sizes = count_tokens_batch([render_turn(t) for t in session.turns]) if session.turns else []
    pieces: list[tuple[Turn, int]] = []
    for turn, size in zip(session.turns, sizes, strict=True):
        if size > max_tokens:
            pieces += [(p, count_tokens(render_turn(p))) for p in _split_turn(turn, max_tokens)]
        else:
            pieces.append((turn, size))
    chunks: list[list[Turn]] = []
    current: list[Turn] = []
    used = 0
    for turn, size in pieces:
        if current and used + size > max_tokens:
            chunks.append(current)
            current, used = [], 0
        current.append(turn)
        used += size
    if current:
        chunks.append(current)
    return chunks


class FullContextFramework(MemoryFramework):
    """Keep no memory: answer from the last ``max_tokens`` tokens of the raw history."""

    name = "full-context"
    description = "no memory: the last context_tokens tokens of the history in the prompt"

    def __init__(self, context: FrameworkContext, max_tokens: int | None = None) -> None:
        super().__init__(context)
        self.max_tokens = int(max_tokens or context.settings.context_tokens)
        self.state = LanceState(f"{context.uri}/{self.name}")
        self.namespace = tuple(context.namespace)

    def ingest(self, session: Session) -> IngestReport:
        """Store the session's turns verbatim (re-ingesting a session replaces it)."""
        lines = [render_turn(t, session.time) for t in session.turns]
        sizes = count_tokens_batch(lines) if lines else []
        turns = [
            {"id": t.id, "role": t.role, "text": t.text, "line": line, "tokens": size}
            for t, line, size in zip(session.turns, lines, sizes, strict=True)
        ]
        self.state.put(self.namespace, {f"session:{session.id}": {"time": session.time, "turns": turns}})
        return IngestReport(session_id=session.id, items_written=len(turns))

    def window(self) -> list[RetrievedItem]:
        """Return the turns inside the token window, oldest first."""
        turns = [
            (sid.removeprefix("session:"), t)
            for sid, value in self.state.items(self.namespace, "session:")
            for t in value["turns"]
        ]
        out: list[RetrievedItem] = []
        used = 0
        for sid, turn in reversed(turns):
            size = turn["tokens"]
            if used + size > self.max_tokens:
                if not out:  # the newest turn alone is too long: keep its end
                    text = truncate_tokens(turn["line"], self.max_tokens, keep="end")
                    out.append(self._item(sid, turn, text, truncated=True))
                break
            out.append(self._item(sid, turn, turn["line"]))
            used += size
        for rank, item in enumerate(out):
            item.score = 1.0 / (rank + 1)
        return out[::-1]

    @staticmethod
    def _item(session_id: str, turn: dict[str, Any], text: str, truncated: bool = False) -> RetrievedItem:
        meta = {"unit": "turn", "role": turn["role"], "turn_id": turn["id"], "truncated": truncated}
        return RetrievedItem(text=text, kind="turn", score=0.0, source_session=session_id, id=turn["id"], meta=meta)

    def retrieve(self, query: str, k: int = 10, *, context: Sequence[Any] | None = None) -> list[RetrievedItem]:
        """Return the ``k`` newest turns of the window, newest first (the query is ignored)."""
        return self.window()[::-1][:k]

    def respond(self, query: str, k: int = 10) -> str:
        """Answer from the whole window (oldest first), whatever ``k``."""
        from dualmem.frameworks.respond import answer_from_items

        return answer_from_items(self.context, query, self.window())

    def reset(self) -> None:
        """Forget every stored session of this namespace."""
        self.state.drop(self.namespace)
