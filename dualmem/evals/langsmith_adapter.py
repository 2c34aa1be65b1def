"""The judges run through ``langsmith.evaluate``: offline by default, one uploaded experiment when a key is set.

Each query of a run is a LangSmith ``Example`` (inputs: question, persona text,
ids; reference outputs: gold answer, facts, insight, memory points; metadata:
persona, task type, category); its id is derived from the dataset, the persona
and the query id, so re-runs and resumed runs meet the same examples. The
target replays what the run recorded (answer, retrieved texts), so the judges
see exactly what the framework produced.

Without ``LANGSMITH_API_KEY`` nothing leaves the machine: ``upload_results=False``,
a client that never calls home, tracing off. With a key (or ``upload=True``),
:func:`open_judging` creates (or reuses) the dataset and its examples, and one
experiment per run whose id the run folder keeps, so a resumed run extends the
same experiment. Every verdict is journaled the moment it is made, so a resumed
run never asks a judge twice (:mod:`dualmem.evals.journal`).
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dualmem.evals.cost import carry
from dualmem.evals.journal import StepLog
from dualmem.evals.judges import Evaluator, flatten_result

NAMESPACE = uuid.UUID("5b0f6a52-3c1e-4d8e-9a51-6f2d0e2f7a10")
warnings.filterwarnings("ignore", message=".*'upload_runs' parameter is in beta.*")


def upload_enabled() -> bool:
    """Return True when a LangSmith API key is configured."""
    return bool(os.environ.get("LANGSMITH_API_KEY") or os.environ.get("LANGCHAIN_API_KEY"))


def example_id(dataset_name: str, persona: str, query_id: str) -> uuid.UUID:
    """Return the stable id of one query's example."""
    return uuid.uuid5(NAMESPACE, f"{dataset_name}/{persona}/{query_id}")


def example_fields(record: Mapping[str, Any], persona_text: str = "") -> dict[str, Any]:
    """Return the inputs, reference outputs and metadata of a record's example (a record or a query's fields)."""
    gold = record.get("gold") or {}
    return {
        "inputs": {
            "question": record["query"],
            "persona": persona_text,
            "query_id": record["query_id"],
            "persona_id": record.get("persona"),
        },
        "outputs": {
            "answer": record.get("reference_answer"),
            "facts": gold.get("facts", []),
            "insight": gold.get("insight"),
            "memory_points": gold.get("memory_points", []),
        },
        "metadata": {k: record.get(k) for k in ("persona", "task_type", "category", "category_name", "protocol")},
    }


def _replay(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "answer": record.get("answer"),
        "retrieved": [r["text"] for r in record.get("retrieved", []) if not r.get("expanded")],
    }


def journaled(judge: Evaluator, journal: StepLog | None) -> Evaluator:
    """Wrap a judge: a verdict recorded in ``journal`` is returned without a model call; a new one is recorded; never raises.

    A judge that raises (a failed call) gives an error result that is not
    recorded, so a resumed run asks it again. Its calls are counted by the
    wrapping context's meter (:func:`dualmem.evals.cost.carry`), in whichever
    thread ``langsmith.evaluate`` runs it.
    """
    name = getattr(judge, "__name__", "judge")
    counted = carry(judge)

    def evaluate(inputs: dict[str, Any], outputs: dict[str, Any], reference_outputs: dict[str, Any]) -> dict[str, Any]:
        """Return this judge's verdict on one example (recorded once)."""
        qid = str(inputs["query_id"])
        if journal is not None and (done := journal.judgement(qid, name)) is not None:
            return dict(done)
        try:
            result = {"results": flatten_result(counted(inputs, outputs, reference_outputs))}
        except Exception as exc:  # noqa: BLE001 - a failed call (network, quota): reported now, asked again on resume
            return {
                "results": [
                    {
                        "key": name,
                        "score": None,
                        "comment": f"error: {exc}",
                        "extra": {"errors": [f"judge raised {type(exc).__name__}: {exc}"]},
                    }
                ]
            }
        failed_call = any((r.get("extra") or {}).get("call_failed") for r in result["results"])
        if journal is not None and not failed_call:  # a verdict, even an unparseable one, is recorded once;
            journal.put_judgement(qid, name, result)  # a call that failed (endpoint down) is asked again on resume
        return result

    evaluate.__name__ = name
    return evaluate


def _as_dict(res: Any) -> dict[str, Any]:
    return {"key": res.key, "score": res.score, "comment": res.comment, "extra": res.extra or {}}


@dataclass
class Judging:
    """Judges of one run and where their results go: offline, or one LangSmith experiment over one dataset."""

    judges: Sequence[Evaluator]
    upload: bool = False
    client: Any = None
    experiment: Any = None  # langsmith TracerSession when uploading
    dataset_id: uuid.UUID | None = None
    dataset_name: str = "dualmem"
    experiment_prefix: str = "dualmem"

    def __post_init__(self) -> None:
        if self.dataset_id is None:
            self.dataset_id = uuid.uuid5(NAMESPACE, self.dataset_name)

    def flush(self) -> None:
        """Send whatever the LangSmith client still holds in its background queue (uploads only)."""
        if self.upload and self.client is not None:
            self.client.flush()

    def examples(self, records: Sequence[Mapping[str, Any]], persona_text: str) -> list[Any]:
        """Return the LangSmith examples of ``records``."""
        from langsmith.schemas import Example

        return [
            Example(
                id=example_id(self.dataset_name, str(r.get("persona")), r["query_id"]),
                dataset_id=self.dataset_id,
                **example_fields(r, persona_text),
            )
            for r in records
        ]

    def judge(
        self,
        records: Sequence[Mapping[str, Any]],
        persona_text: str = "",
        journal: StepLog | None = None,
        on_judged: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Return ``records`` with ``judges`` filled by ``langsmith.evaluate`` (answered records only)."""
        names = [getattr(j, "__name__", "judge") for j in self.judges]
        answered = [r for r in records if r.get("answer") is not None]
        done = {
            r["query_id"]
            for r in answered
            if journal is not None and all(journal.judgement(r["query_id"], n) is not None for n in names)
        }
        results: dict[str, list[dict[str, Any]]] = {}
        for rec in answered:
            if rec["query_id"] in done and journal is not None:
                results[rec["query_id"]] = [
                    res for n in names for res in journal.judgement(rec["query_id"], n)["results"]
                ]
                if on_judged:
                    on_judged(rec)
        todo = [r for r in answered if r["query_id"] not in done]
        if todo:
            for qid, rows in self._evaluate(todo, persona_text, journal, on_judged).items():
                results[qid] = rows
        out = []
        for rec in records:
            rows = results.get(rec["query_id"], [])
            errors = [f"judge {r['key']}: {e}" for r in rows for e in (r.get("extra") or {}).get("errors", [])]
            out.append(
                {
                    **rec,
                    "judges": {**rec.get("judges", {}), **{r["key"]: r for r in rows}},
                    "errors": [*rec.get("errors", []), *errors],
                }
            )
        return out

    def _evaluate(
        self,
        records: Sequence[Mapping[str, Any]],
        persona_text: str,
        journal: StepLog | None,
        on_judged: Callable[[Mapping[str, Any]], None] | None,
    ) -> dict[str, list[dict[str, Any]]]:
        import langsmith
        from langsmith.run_helpers import tracing_context

        by_id = {r["query_id"]: r for r in records}

        def dualmem_answer(inputs: dict[str, Any]) -> dict[str, Any]:
            """Replay the recorded answer and retrieved texts of one example."""
            return _replay(by_id[inputs["query_id"]])

        kwargs: dict[str, Any] = {
            "data": self.examples(records, persona_text),
            "evaluators": [journaled(j, journal) for j in self.judges],
            "max_concurrency": 0,
            "upload_results": self.upload,
            "blocking": False,
            "disable_evaluator_tracing": not self.upload,
        }
        out: dict[str, list[dict[str, Any]]] = {}
        with tracing_context(enabled=self.upload):
            if self.upload:
                kwargs.update(client=self.client, experiment=self.experiment)
            else:  # a client that never calls home: server info given, no background batch tracing
                kwargs.update(client=self.client or offline_client(), experiment_prefix=self.experiment_prefix)
            for row in langsmith.evaluate(dualmem_answer, **kwargs):
                example = row["example"]
                if example is None:  # langsmith types it optional; evaluate always sets it
                    continue
                qid = (example.inputs or {})["query_id"]
                out[qid] = [_as_dict(res) for res in row["evaluation_results"]["results"]]
                if on_judged:
                    on_judged(by_id[qid])
        return out


def offline_client() -> Any:
    """Return a LangSmith client that makes no network call (for ``upload_results=False``)."""
    import langsmith

    return langsmith.Client(api_key="offline", info={}, auto_batch_tracing=False)


def dataset_name_for(kind: str, path: str) -> str:
    """Return the LangSmith dataset name of a dataset file or folder (``dualmem-<kind>-<name>``)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(os.path.normpath(path)).removesuffix(".json"))
    return f"dualmem-{kind}-{stem}"


def open_judging(
    judges: Sequence[Evaluator],
    *,
    upload: bool,
    dataset_name: str,
    example_records: Sequence[Mapping[str, Any]],
    persona_texts: Mapping[str, str],
    experiment_name: str,
    experiment_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    client: Any = None,
) -> Judging:
    """Return the run's judging: offline, or (``upload``) the dataset's examples uploaded and the run's experiment.

    ``example_records`` are record-like dicts of every query of the run (before
    answering); missing examples are created; ``experiment_id`` (kept in the run
    folder) reuses the experiment of an interrupted run.
    """
    if not upload:
        return Judging(judges, dataset_name=dataset_name, experiment_prefix=experiment_name)
    import langsmith

    client = client or langsmith.Client()
    if client.has_dataset(dataset_name=dataset_name):
        dataset = client.read_dataset(dataset_name=dataset_name)
    else:
        dataset = client.create_dataset(dataset_name, description="DualMem evaluation queries with gold evidence")
    have = {str(e.id) for e in client.list_examples(dataset_id=dataset.id)}
    new = []
    for r in example_records:
        fields = example_fields(r, persona_texts.get(str(r["persona"]), ""))
        eid = str(example_id(dataset_name, str(r["persona"]), r["query_id"]))
        if eid not in have:
            new.append(
                {
                    "id": eid,
                    "inputs": fields["inputs"],
                    "reference_outputs": fields["outputs"],
                    "metadata": fields["metadata"],
                }
            )
    if new:
        client.create_examples(dataset_id=dataset.id, examples=new)
    if experiment_id:
        experiment = client.read_project(project_id=experiment_id)
    else:
        from langsmith.utils import LangSmithConflictError

        try:
            experiment = client.create_project(
                experiment_name, reference_dataset_id=dataset.id, metadata=dict(metadata or {})
            )
        except LangSmithConflictError:  # the name is taken (another run folder of the same name): keep both
            experiment = client.create_project(
                f"{experiment_name}-{uuid.uuid4().hex[:6]}",
                reference_dataset_id=dataset.id,
                metadata=dict(metadata or {}),
            )
    return Judging(
        judges,
        upload=True,
        client=client,
        experiment=experiment,
        dataset_id=dataset.id,
        dataset_name=dataset_name,
        experiment_prefix=experiment_name,
    )
