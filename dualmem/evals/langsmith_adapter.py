"""Run the judges through ``langsmith.evaluate``: offline by default, uploaded when a key is set.

Records of a run become LangSmith ``Example`` objects (inputs: question and
persona; reference outputs: gold answer, facts, insight, memory points); the
target replays the recorded answer and retrieved texts, so the judges see
exactly what the run produced. Without ``LANGSMITH_API_KEY`` (or with
``upload=False``) nothing leaves the machine: ``upload_results=False`` and
tracing off.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from dualmem.evals.judges import Evaluator

NAMESPACE = uuid.UUID("5b0f6a52-3c1e-4d8e-9a51-6f2d0e2f7a10")


def upload_enabled() -> bool:
    """Return True when a LangSmith API key is configured."""
    return bool(os.environ.get("LANGSMITH_API_KEY") or os.environ.get("LANGCHAIN_API_KEY"))


def examples_from_records(records: Sequence[Mapping[str, Any]], persona_text: Mapping[str, str] | None = None) -> list[Any]:
    """Return one ``langsmith.schemas.Example`` per record (stable ids from persona and query id)."""
    from langsmith.schemas import Example

    dataset_id = uuid.uuid5(NAMESPACE, "dualmem-eval")
    out = []
    for rec in records:
        gold = rec.get("gold") or {}
        out.append(
            Example(
                id=uuid.uuid5(NAMESPACE, f"{rec.get('persona')}/{rec['query_id']}"),
                dataset_id=dataset_id,
                inputs={"question": rec["query"], "persona": (persona_text or {}).get(rec.get("persona", ""), ""),
                        "query_id": rec["query_id"], "persona_id": rec.get("persona")},
                outputs={"answer": rec.get("reference_answer"), "facts": gold.get("facts", []),
                         "insight": gold.get("insight"), "memory_points": gold.get("memory_points", [])},
                metadata={k: rec.get(k) for k in ("persona", "task_type", "category", "protocol")},
            )
        )
    return out


def evaluate_records(
    records: Sequence[Mapping[str, Any]],
    judges: Sequence[Evaluator],
    *,
    upload: bool | None = None,
    experiment_prefix: str = "dualmem",
    persona_text: Mapping[str, str] | None = None,
    max_concurrency: int = 0,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score recorded answers with ``judges`` via ``langsmith.evaluate``; return ``{query_id: {key: result}}``."""
    import langsmith
    from langsmith.run_helpers import tracing_context

    upload = upload_enabled() if upload is None else upload
    by_id = {(r.get("persona"), r["query_id"]): r for r in records}

    def target(inputs: dict[str, Any]) -> dict[str, Any]:
        """Replay the recorded answer and retrieved texts of one example."""
        rec = by_id[(inputs.get("persona_id"), inputs["query_id"])]
        retrieved = [r["text"] for r in rec.get("retrieved", []) if not r.get("expanded")]
        return {"answer": rec.get("answer"), "retrieved": retrieved}

    kwargs: dict[str, Any] = {"data": examples_from_records(records, persona_text), "evaluators": list(judges),
                              "experiment_prefix": experiment_prefix, "max_concurrency": max_concurrency,
                              "upload_results": upload, "disable_evaluator_tracing": not upload}
    if upload:
        results = langsmith.evaluate(target, **kwargs)
    else:
        os.environ.setdefault("LANGSMITH_TEST_TRACKING", "false")
        # a client that never calls home: server info given, no background batch tracing
        kwargs["client"] = langsmith.Client(api_key="offline", info={}, auto_batch_tracing=False)
        with tracing_context(enabled=False), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*upload_results.*")
            results = langsmith.evaluate(target, **kwargs)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in results:
        example = row["example"]
        if example is None:  # langsmith types it optional; evaluate always sets it
            continue
        qid = (example.inputs or {})["query_id"]
        out[qid] = {
            res.key: {"key": res.key, "score": res.score, "comment": res.comment, "extra": res.extra}
            for res in row["evaluation_results"]["results"]
        }
    return out
