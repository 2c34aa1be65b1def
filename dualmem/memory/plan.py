"""Validate a writer ``MemoryUpdate`` against the view and turn it into a store plan.

Rules (each rejected op is recorded with its reason, never dropped silently):

- ``ADD`` needs text; a new fact within ``dedup_threshold`` cosine of a view fact
  (or of an earlier new fact) is *merged*: its label then points at that fact;
- ``UPDATE`` / ``DELETE`` only on ids shown in the view, on the right stream;
- an insight must cite at least one fact, and every cited id must be a view
  fact (``F3``) or a fact added by the same update (``N1``), not deleted by it;
- new store ids are ``stable_id(namespace, chunk id, stream, label)``, so a
  replayed plan writes the same rows;
- at most ``max_ops`` operations per chunk, in answer order (facts first); the
  rest are rejected ("over the cap …");
- the memory-poisoning guard (:func:`dualmem.memory.guard.screen`) runs before
  the rules above: a fact drawn from a request to change the persona's memory
  is kept as a request fact (``meta.guard``), which no insight may cite (nor
  one of an earlier chunk, shown in the view); an insight repeating a request
  or adopting a user's claim about the persona is rejected (``guard: …``).

``UPDATE`` rewrites the item in place (same id, so insights citing it stay
valid) and keeps the previous version as a superseded snapshot row; ``DELETE``
supersedes. A ``DELETE`` wins over any other op of the same update on that item.

Pure: the plan depends only on its arguments — the update, the view, the chunk,
``now`` (the time written on the rows) and ``seq`` (the chunk's commit order,
written as ``meta["seq"]`` on new items) — and on the embedder's vectors of the
new texts. The plan is plain data (rows and their vectors), checkpointed before
it is applied, so a replayed plan writes the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from typing_extensions import TypedDict

from dualmem.memory import guard
from dualmem.memory.chunking import Chunk
from dualmem.memory.versions import version_row
from dualmem.memory.view import View, ViewEntry
from dualmem.schema import FactOp, InsightOp, MemoryItem, MemoryUpdate, SourceRef, stable_id, utcnow
from dualmem.vectors import cosine


class Plan(TypedDict):
    """What applying one chunk's update writes: item rows (the last row of an id wins) and their vectors."""

    upserts: list[dict[str, Any]]
    vectors: dict[str, list[float]]
    supersede: list[str]
    applied: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    merged: list[dict[str, Any]]


def _norm_label(label: str) -> str:
    return str(label).strip().strip("[]()").upper()


def _record(op: FactOp | InsightOp, stream: str, **extra: Any) -> dict[str, Any]:
    return {"stream": stream, "op": op.op, "id": op.id, "text": op.text, **extra}


def _snapshot(entry: ViewEntry, chunk_id: str) -> dict[str, Any]:
    """Return the superseded copy of a view item's current version (a history row under its own id)."""
    return version_row(entry["item"], entry["id"], chunk_id)


class _Planner:
    """One update's validation pass (private: use :func:`plan_update`)."""

    def __init__(
        self,
        view: View,
        chunk: Chunk,
        namespace: Sequence[str],
        embeddings: Embeddings | None,
        threshold: float,
        now: Any,
        seq: int,
    ) -> None:
        self.view, self.chunk, self.namespace = view, chunk, tuple(namespace)
        self.embeddings, self.threshold = embeddings, threshold
        self.facts = {e["label"]: e for e in view["facts"]}
        self.insights = {e["label"]: e for e in view["insights"]}
        self.fact_ids = {e["id"]: e for e in view["facts"]}
        self.labels: dict[str, str] = {label: e["id"] for label, e in self.facts.items()}  # citable fact labels
        self.turns_of: dict[str, list[str]] = {
            e["id"]: list(e["item"].get("source", {}).get("turn_ids", [])) for e in view["facts"]
        }
        self.deleted: set[str] = set()
        self.flagged = {f["turn_id"] for f in chunk.get("flagged") or []}
        self.requests: dict[str, Any] = {}  # label -> the flag of a request fact added by this update
        self.request_of_turn: dict[str, str] = {}  # flagged turn id -> its request fact's store id
        self.request_ids = {e["id"] for e in view["facts"] if guard.is_request_item(e["item"])}
        self.now, self.seq = now, seq
        self.plan = Plan(upserts=[], vectors={}, supersede=[], applied=[], rejected=[], merged=[])
        self.pending_texts: dict[str, str] = {}  # row id -> text still to embed (rewrites)
        self.vectors: dict[str, list[float]] = {}  # text -> its vector, for this update's texts (embed_all)

    # ------------------------------------------------------------------ helpers
    def reject(self, op: FactOp | InsightOp, stream: str, reason: str) -> None:
        self.plan["rejected"].append(_record(op, stream, reason=reason))

    def source(self, turn_ids: Sequence[str]) -> tuple[SourceRef, bool]:
        valid = [t for t in (str(x).strip("[] ") for x in turn_ids) if t in self.chunk["turn_ids"]]
        inferred = not valid
        users = [
            t for t in self.chunk.get("user_turn_ids") or [] if t not in self.flagged
        ]  # never a request by default
        fallback = users or [t for t in self.chunk["turn_ids"] if t not in self.flagged] or self.chunk["turn_ids"]
        return SourceRef(
            session_id=self.chunk["session_id"], turn_ids=valid or list(fallback), chunk_id=self.chunk["id"]
        ), inferred

    def new_id(self, stream: str, label: str) -> str:
        return stable_id(*self.namespace, self.chunk["id"], stream, label, prefix=stream[0])

    def embed_all(self, ops: Sequence[FactOp | InsightOp]) -> None:
        """Embed every text the operations may need in one call (the passes then take their vectors from it)."""
        texts = list(dict.fromkeys(t for op in ops if op.op != "DELETE" for t in (op.text, op.text.strip()) if t))
        if texts and self.embeddings is not None:
            self.vectors = dict(
                zip(texts, ([*map(float, v)] for v in self.embeddings.embed_documents(texts)), strict=True)
            )

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts or self.embeddings is None:
            return [[] for _ in texts]
        missing = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if missing:
            self.vectors.update(
                zip(missing, ([*map(float, v)] for v in self.embeddings.embed_documents(missing)), strict=True)
            )
        return [list(self.vectors[t]) for t in texts]

    def view_vectors(self, entries: Sequence[ViewEntry]) -> list[list[float]]:
        """Return the view items' stored vectors (embedding only those the view came without)."""
        missing = [e["text"] for e in entries if not e.get("vector")]
        fresh = iter(self.embed(missing))
        return [list(e["vector"]) if e.get("vector") else next(fresh) for e in entries]

    def keep(self, row: dict[str, Any], vector: Sequence[float] | None) -> None:
        """Add a row to write, with its vector when known."""
        self.plan["upserts"].append(row)
        if vector:
            self.plan["vectors"][row["id"]] = [float(x) for x in vector]

    def rewrite(self, entry: ViewEntry, text: str, **changes: Any) -> None:
        """UPDATE in place: the snapshot keeps the old version."""
        self.keep(_snapshot(entry, self.chunk["id"]), entry.get("vector"))
        item = dict(entry["item"])
        meta = {**(item.get("meta") or {}), "updated_by_chunk": self.chunk["id"]}
        item.update(text=text, updated_at=self.now.isoformat(), meta=meta, status="active", **changes)
        self.keep(item, entry.get("vector") if text == entry["text"] else None)
        if text != entry["text"]:
            self.pending_texts[item["id"]] = text

    def delete(self, entry: ViewEntry) -> None:
        """DELETE: the item stays as a superseded row (history), hidden from search."""
        item = dict(entry["item"])
        meta = {**(item.get("meta") or {}), "deleted_by_chunk": self.chunk["id"]}
        item.update(status="superseded", updated_at=self.now.isoformat(), meta=meta)
        self.keep(item, entry.get("vector"))
        self.plan["supersede"].append(entry["id"])

    def finish(self) -> Plan:
        """Embed the rewritten texts, let a DELETE win over other rows of its item, and return the plan."""
        todo = {i: t for i, t in self.pending_texts.items() if i not in self.plan["supersede"]}
        for row_id, vec in zip(todo, self.embed(list(todo.values())), strict=True):
            if vec:
                self.plan["vectors"][row_id] = vec
        deleted = set(self.plan["supersede"])
        rows = [r for r in self.plan["upserts"] if r["id"] not in deleted or r["status"] == "superseded"]
        self.plan["upserts"] = rows
        return self.plan

    # ------------------------------------------------------------------ facts
    def facts_pass(self, ops: Sequence[FactOp]) -> None:
        adds = [op for op in ops if op.op == "ADD"]
        new_vecs = self.embed([op.text for op in adds]) if adds else []
        view_vecs = self.view_vectors(self.view["facts"]) if adds else []
        known: list[tuple[str, list[float]]] = [
            (e["id"], v) for e, v in zip(self.view["facts"], view_vecs, strict=False)
        ]
        add_vec = {id(op): v for op, v in zip(adds, new_vecs, strict=True)}
        for op in ops:
            label = _norm_label(op.id)
            if op.op == "ADD":
                self.add_fact(op, label, add_vec[id(op)], known)
            elif label not in self.facts:
                self.reject(op, "fact", f"{op.op} of {op.id!r}: not a fact id of the working memory (F1…)")
            elif op.op == "UPDATE":
                if not op.text.strip():
                    self.reject(op, "fact", "UPDATE without text")
                    continue
                entry = self.facts[label]
                src = SourceRef.model_validate(entry["item"].get("source") or {})
                extra, _ = self.source(op.turn_ids)
                turns = (
                    src.turn_ids + [t for t in extra.turn_ids if t not in src.turn_ids] if op.turn_ids else src.turn_ids
                )
                self.rewrite(entry, op.text.strip(), source={**src.model_dump(), "turn_ids": turns})
                self.plan["applied"].append(_record(op, "fact", store_id=entry["id"]))
            else:  # DELETE
                entry = self.facts[label]
                self.delete(entry)
                self.deleted.add(entry["id"])
                self.plan["applied"].append(_record(op, "fact", store_id=entry["id"]))

    def add_fact(self, op: FactOp, label: str, vec: list[float], known: list[tuple[str, list[float]]]) -> None:
        text = op.text.strip()
        if not text:
            self.reject(op, "fact", "ADD without text")
            return
        if label in self.labels and label not in self.facts:
            self.reject(op, "fact", f"label {op.id!r} used twice in one update")
            return
        flag = self.requests.get(label)
        if flag is None:
            best = max(((cosine(vec, v), sid) for sid, v in known if v), default=(0.0, ""))
        else:  # a request is never merged into an ordinary fact; one request fact per flagged turn
            best = (
                (1.0, self.request_of_turn[flag["turn_id"]]) if flag["turn_id"] in self.request_of_turn else (0.0, "")
            )
        if (vec or flag is not None) and best[0] >= self.threshold:
            if label not in self.facts:
                self.labels[label] = best[1]
            self.plan["merged"].append(_record(op, "fact", into=best[1], similarity=round(best[0], 4)))
            return
        source, inferred = self.source(op.turn_ids)
        sid = self.new_id("fact", label)
        meta: dict[str, Any] = {"label": label, "turn_ids_inferred": inferred, "seq": self.seq}
        said = self.chunk.get("said") or {}
        if quotes := {t: said[t] for t in source.turn_ids if t in said}:
            meta["said"] = quotes  # the source turns' words (the memory browser shows them)
        if flag is not None:  # kept as what the user asked, in their words
            text, meta["guard"], meta["model_text"] = (
                guard.request_fact_text(flag),
                guard.guard_meta(flag),
                op.text.strip(),
            )
            source = source.model_copy(update={"turn_ids": [flag["turn_id"]]})
            self.request_ids.add(sid)
            self.request_of_turn[flag["turn_id"]] = sid
        item = MemoryItem(
            id=sid,
            namespace=self.namespace,
            kind="fact",
            text=text,
            source=source,
            event_time=self.chunk["time"],
            created_at=self.now,
            updated_at=self.now,
            meta=meta,
        )
        self.keep(item.model_dump(mode="json"), vec if flag is None else None)
        if flag is not None:  # stored in the user's words: embedded as stored
            self.pending_texts[sid] = text
        if label not in self.facts:  # a colliding label stays the view's
            self.labels[label] = sid
        self.turns_of[sid] = source.turn_ids
        known.append((sid, vec))
        self.plan["applied"].append(_record(op, "fact", store_id=sid, **({"request": True} if "guard" in meta else {})))

    # ------------------------------------------------------------------ insights
    def cite(self, op: InsightOp) -> tuple[list[str], str | None]:
        ids: list[str] = []
        for raw in op.fact_ids:
            label = _norm_label(raw)
            sid = self.labels.get(label) or (str(raw) if str(raw) in self.fact_ids else None)
            if sid is None:
                return [], f"cites {raw!r}, which is neither a working-memory fact nor a fact added in this update"
            if sid in self.deleted:
                return [], f"cites {raw!r}, which this update deletes"
            if sid in self.request_ids:
                return (
                    [],
                    f"guard: cites {raw!r}, a request to change my memory (kept as a fact about what the user asked), not an event",
                )
            if sid not in ids:
                ids.append(sid)
        return ids, None

    def insights_pass(self, ops: Sequence[InsightOp]) -> None:
        adds = [op for op in ops if op.op == "ADD"]
        new_vecs = self.embed([op.text for op in adds]) if adds else []
        view_vecs = self.view_vectors(self.view["insights"]) if adds else []
        known = [(e["id"], v) for e, v in zip(self.view["insights"], view_vecs, strict=False)]
        add_vec = {id(op): v for op, v in zip(adds, new_vecs, strict=True)}
        seen: set[str] = set()
        for op in ops:
            label = _norm_label(op.id)
            if op.op in ("UPDATE", "DELETE") and label not in self.insights:
                self.reject(op, "insight", f"{op.op} of {op.id!r}: not an insight id of the working memory (I1…)")
                continue
            if op.op == "DELETE":
                entry = self.insights[label]
                self.delete(entry)
                self.plan["applied"].append(_record(op, "insight", store_id=entry["id"]))
                continue
            if not op.text.strip():
                self.reject(op, "insight", f"{op.op} without text")
                continue
            if op.op == "UPDATE" and not op.fact_ids:
                entry = self.insights[label]
                self.rewrite(entry, op.text.strip())
                self.plan["applied"].append(_record(op, "insight", store_id=entry["id"]))
                continue
            grounding, problem = self.cite(op)
            if problem or not grounding:
                self.reject(op, "insight", problem or "an insight must cite at least one fact id")
                continue
            turns = [t for g in grounding for t in self.turns_of.get(g, [])]
            if op.op == "UPDATE":
                entry = self.insights[label]
                src = {**(entry["item"].get("source") or {}), "turn_ids": list(dict.fromkeys(turns))}
                self.rewrite(entry, op.text.strip(), grounding=grounding, source=src)
                self.plan["applied"].append(_record(op, "insight", store_id=entry["id"], grounding=grounding))
                continue
            if label in seen:
                self.reject(op, "insight", f"label {op.id!r} used twice in one update")
                continue
            seen.add(label)
            vec = add_vec[id(op)]
            best = max(((cosine(vec, v), sid) for sid, v in known if v), default=(0.0, ""))
            if vec and best[0] >= self.threshold:
                self.plan["merged"].append(_record(op, "insight", into=best[1], similarity=round(best[0], 4)))
                continue
            sid = self.new_id("insight", label)
            item = MemoryItem(
                id=sid,
                namespace=self.namespace,
                kind="insight",
                text=op.text.strip(),
                source=SourceRef(
                    session_id=self.chunk["session_id"], turn_ids=list(dict.fromkeys(turns)), chunk_id=self.chunk["id"]
                ),
                event_time=self.chunk["time"],
                created_at=self.now,
                updated_at=self.now,
                grounding=grounding,
                meta={"label": label, "seq": self.seq},
            )
            self.keep(item.model_dump(mode="json"), vec)
            known.append((sid, vec))
            self.plan["applied"].append(_record(op, "insight", store_id=sid, grounding=grounding))


def plan_update(
    update: MemoryUpdate,
    view: View,
    chunk: Chunk,
    namespace: Sequence[str],
    *,
    embeddings: Embeddings | None = None,
    dedup_threshold: float = 0.92,
    max_ops: int | None = None,
    now: Any = None,
    seq: int = 0,
) -> Plan:
    """Validate ``update`` against ``view`` and return the rows to write (see the module rules).

    ``now``: the time written on new and changed rows (default: the clock); ``seq``: the chunk's commit order.
    """
    planner = _Planner(view, chunk, namespace, embeddings, dedup_threshold, now if now is not None else utcnow(), seq)
    facts, insights = list(update.facts), list(update.insights)
    if max_ops is not None and len(facts) + len(insights) > max_ops:
        keep_facts = facts[:max_ops]
        keep_insights = insights[: max_ops - len(keep_facts)]
        reason = f"over the cap of {max_ops} operations per chunk (setting max_ops_per_chunk)"
        for op in facts[len(keep_facts) :]:
            planner.reject(op, "fact", reason)
        for iop in insights[len(keep_insights) :]:
            planner.reject(iop, "insight", reason)
        facts, insights = keep_facts, keep_insights
    screened = guard.screen(facts, insights, chunk.get("flagged") or [], view["facts"], chunk.get("claims") or [])
    planner.plan["rejected"].extend(screened.rejected)
    planner.requests = dict(screened.requests)
    planner.embed_all([*screened.facts, *screened.insights])
    planner.facts_pass(screened.facts)
    planner.insights_pass(screened.insights)
    return planner.finish()
