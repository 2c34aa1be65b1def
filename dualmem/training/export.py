"""Export SFT data for the writer: chat-format JSONL and the LLaMA-Factory layout.

Two sources, one record shape ``{"messages": [system, user, assistant], "persona_id",
"episode_id", "chunk_id", "source"}`` where system/user are the writer's exact
prompt (:func:`dualmem.prompts.writer.render_writer_messages`) and assistant is
the target ``MemoryUpdate`` as JSON:

- **gold** (no teacher model): each RoleMemo history is chunked like the writer
  and its gold written through the writer's core on the in-memory store
  (:func:`~dualmem.training.episode.gold_steps`): the prompt is the product's
  prompt for the product's view of the gold written so far; a chunk's target
  ADDs the fragment facts it contains, and a query's insight, citing the facts
  the writer can cite there, at the chunk that completes its fragments. Chunks
  with nothing to write are kept with probability ``keep_empty``
  (deterministic per chunk id).
- **teacher traces**: JSONL of recorded writer runs, one line per chunk::

      {"messages": [{"role": "system", "content": ...}, {"role": "user", "content": ...}],
       "output": {"facts": [...], "insights": [...]},   # or the raw JSON string
       "persona_id": "...", "meta": {...}}

Every record is validated (the target parses as ``MemoryUpdate``; insights cite
facts that exist in the view or the same update; UPDATE/DELETE name view ids)
and the split is by persona: no persona is in both train and eval.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dualmem.config import setting_default
from dualmem.context import Context
from dualmem.errors import DatasetError
from dualmem.schema import Dataset, MemoryUpdate
from dualmem.training.episode import build_episode, fraction, gold_steps
from dualmem.training.writing import writer_context

LLAMAFACTORY_NAME = "dualmem_writer"
VIEW_ID = re.compile(r"\b([FI]\d+)\b")


def gold_records(
    dataset: Dataset,
    *,
    chunk_tokens: int | None = None,
    keep_empty: float = 0.2,
    progress: bool = False,
    ctx: Context | None = None,
    notes: Counter[str] | None = None,
) -> list[dict[str, Any]]:
    """Return SFT records whose targets come from RoleMemo gold (no teacher model).

    ``ctx``: the writer's context (view size, embedder, ``chunk_tokens``; default
    :func:`~dualmem.training.writing.writer_context`); ``chunk_tokens`` overrides its chunk size; ``notes`` counts what
    the gold walk left out and why (:func:`~dualmem.training.episode.gold_steps`).
    """
    from tqdm.auto import tqdm

    ctx = writer_context(ctx, chunk_tokens=chunk_tokens)
    records = []
    for item in tqdm(dataset.items, desc="export histories", unit="history", disable=not progress):
        episode = build_episode(item, chunk_tokens=ctx.settings.tuning.chunk_tokens)
        for step in gold_steps(episode, ctx, notes):
            empty = not step.target.facts and not step.target.insights
            if empty and fraction("empty", step.chunk["id"]) >= keep_empty:
                continue
            messages = [*step.messages, {"role": "assistant", "content": step.target.model_dump_json()}]
            records.append(
                {
                    "messages": messages,
                    "persona_id": episode.persona.id,
                    "episode_id": episode.id,
                    "chunk_id": step.chunk["id"],
                    "source": "gold",
                }
            )
    return records


def load_traces(path: str | Path) -> list[dict[str, Any]]:
    """Read teacher traces (JSONL, format in the module doc) into SFT records."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                trace = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    str(path), f"line {n}", "a JSON object", f"invalid JSON ({exc.msg} at col {exc.colno})"
                ) from exc
            for key in ("messages", "output"):
                if key not in trace:
                    raise DatasetError(str(path), f"line {n}.{key}", f"key {key!r}", "missing")
            output = trace["output"] if isinstance(trace["output"], str) else json.dumps(trace["output"])
            prompt = [m for m in trace["messages"] if m.get("role") != "assistant"]
            persona = trace.get("persona_id") or trace.get("meta", {}).get("persona_id") or "unknown"
            records.append(
                {
                    "messages": [*prompt, {"role": "assistant", "content": output}],
                    "persona_id": persona,
                    "episode_id": trace.get("meta", {}).get("episode_id", persona),
                    "chunk_id": trace.get("meta", {}).get("chunk_id", f"trace-{n}"),
                    "source": "teacher",
                }
            )
    return records


def validate_record(record: dict[str, Any]) -> list[str]:
    """Return the problems of one record (empty when it is valid)."""
    messages = record.get("messages") or []
    if len(messages) < 2 or messages[-1].get("role") != "assistant":
        return ["the last message must be the assistant's target"]
    try:
        update = MemoryUpdate.model_validate_json(messages[-1]["content"])
    except ValidationError as exc:
        return [f"target is not a MemoryUpdate: {exc.errors()[0]['msg']}"]
    view_ids = {
        m for msg in messages[:-1] if msg.get("role") == "user" for m in VIEW_ID.findall(msg.get("content", ""))
    }
    new = {op.id for op in update.facts if op.op == "ADD"}
    errors = []
    for op in update.facts:
        if op.op != "ADD" and op.id not in view_ids:
            errors.append(f"fact {op.op} {op.id}: not in the working view")
    for ins in update.insights:
        if ins.op != "ADD" and ins.id not in view_ids:
            errors.append(f"insight {ins.op} {ins.id}: not in the working view")
        if ins.op != "DELETE":
            if not ins.fact_ids:
                errors.append(f"insight {ins.id}: cites no fact")
            errors += [
                f"insight {ins.id}: cites missing fact {f}" for f in ins.fact_ids if f not in new and f not in view_ids
            ]
    return errors


def split_by_persona(
    records: list[dict[str, Any]], eval_ratio: float = 0.1, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split records so that no persona is in both parts; with >= 2 personas each part gets one."""
    personas = sorted({r["persona_id"] for r in records})
    held = {p for p in personas if fraction(seed, p) < eval_ratio}
    if len(personas) >= 2 and eval_ratio > 0:
        if not held:
            held = {min(personas, key=lambda p: fraction(seed, p))}
        if held == set(personas):
            held.discard(max(personas, key=lambda p: fraction(seed, p)))
    return [r for r in records if r["persona_id"] not in held], [r for r in records if r["persona_id"] in held]


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write rows atomically (temp file then rename); return the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    n = 0
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def llamafactory_info(name: str = LLAMAFACTORY_NAME, files: dict[str, str] | None = None) -> dict[str, Any]:
    """Return LLaMA-Factory ``dataset_info.json`` entries (sharegpt layout, OpenAI-style role/content tags)."""
    files = files or {"train": "train.jsonl", "eval": "eval.jsonl"}
    tags = {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
        "system_tag": "system",
    }
    return {
        f"{name}_{part}": {
            "file_name": file,
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": tags,
        }
        for part, file in files.items()
    }


@dataclass
class ExportReport:
    """What an export wrote."""

    out_dir: str
    train: int = 0
    eval: int = 0
    personas_train: list[str] = field(default_factory=list)
    personas_eval: list[str] = field(default_factory=list)
    by_source: dict[str, int] = field(default_factory=dict)
    invalid: list[str] = field(default_factory=list)
    gold_notes: dict[str, int] = field(default_factory=dict)  # what the gold walks left out, and why


def export_sft(
    out_dir: str | Path,
    *,
    dataset: Dataset | None = None,
    traces: Sequence[str | Path] = (),
    chunk_tokens: int = setting_default("chunk_tokens"),
    view_k: int = setting_default("view_k"),
    view_recent: int = setting_default("view_recent"),
    keep_empty: float = 0.2,
    eval_ratio: float = 0.1,
    seed: int = 0,
    strict: bool = True,
    progress: bool = False,
    realmem: Dataset | None = None,
    max_chunks: int | None = None,
    embedder: Any = None,
) -> ExportReport:
    """Build, validate, split and write SFT data (``train.jsonl``, ``eval.jsonl``, ``dataset_info.json``).

    ``dataset``: RoleMemo (fact and insight targets from its gold); ``realmem``: RealMem (memory points as fact
    targets, the first ``max_chunks`` chunks of each history, insights out of the loss, see
    :mod:`dualmem.training.realmem_gold`); ``traces``: teacher JSONL. Gold prompts show the product's working view
    (``view_k``, ``view_recent``, ``embedder``: a spec or object, default the ``embedder`` setting's).
    """
    from dualmem.training.realmem_gold import realmem_records

    notes: Counter[str] = Counter()
    ctx = writer_context(embedder=embedder, view_k=view_k, view_recent=view_recent, chunk_tokens=chunk_tokens)
    records = gold_records(dataset, ctx=ctx, keep_empty=keep_empty, progress=progress, notes=notes) if dataset else []
    if realmem:
        records += realmem_records(
            realmem, ctx=ctx, keep_empty=keep_empty, max_chunks=max_chunks, progress=progress, notes=notes
        )
    for path in traces:
        records += load_traces(path)
    report = ExportReport(str(out_dir), gold_notes=dict(sorted(notes.items())))
    good = []
    for rec in records:
        problems = validate_record(rec)
        if problems:
            report.invalid.append(f"{rec['source']}:{rec['chunk_id']}: {'; '.join(problems)}")
        else:
            good.append(rec)
    if strict and report.invalid:
        raise DatasetError(
            "sft export", report.invalid[0].split(":")[1], "a valid MemoryUpdate target", report.invalid[0]
        )
    train, held = split_by_persona(good, eval_ratio=eval_ratio, seed=seed)
    out = Path(out_dir)
    report.train = write_jsonl(out / "train.jsonl", train)
    report.eval = write_jsonl(out / "eval.jsonl", held)
    (out / "dataset_info.json").write_text(json.dumps(llamafactory_info(), indent=2))
    report.personas_train = sorted({r["persona_id"] for r in train})
    report.personas_eval = sorted({r["persona_id"] for r in held})
    for rec in good:
        report.by_source[rec["source"]] = report.by_source.get(rec["source"], 0) + 1
    (out / "export_report.json").write_text(json.dumps(vars(report), indent=2))
    return report
