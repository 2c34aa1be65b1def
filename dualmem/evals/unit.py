"""One evaluation unit: one persona's history × one memory framework, run start to end wherever it is scheduled.

:func:`run_unit` opens the framework on the persona's namespace and store
folder (the memory an earlier attempt left: nothing is reset), runs the
protocol (ingest, retrieve / answer each query, metrics), then the judges,
and records the unit as finished in the run record with its result. Every
step is journaled in the unit's steps as it finishes, so a unit run again —
its worker lost, its driver killed — reads back what was done and calls no
model for it (the framework's own chunk ledger makes a half-written session
go on where it stopped). A unit found finished in the record is returned
from it without opening anything.

The same function runs in a thread of the evaluating process and in a Ray
worker (:mod:`dualmem.evals.cluster`): a :class:`UnitEnv` holds what a unit
needs besides its persona's history — models and embedders as objects (in
this process) or as specs (anywhere), the record, the judges' plan, progress
hooks.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from dualmem.config import Settings
from dualmem.evals import langsmith_adapter as ls
from dualmem.evals.cost import Meter, add
from dualmem.evals.judges import judges_for
from dualmem.evals.langsmith_adapter import Judging
from dualmem.evals.record import RunRecord
from dualmem.evals.runners import FAILED_CALLS, RunOptions, kept_queries, persona_text, run_item
from dualmem.evals.runspec import write_run
from dualmem.frameworks import FrameworkContext, MemoryFramework, open_framework
from dualmem.models.tokens import count_tokens_batch
from dualmem.schema import DatasetItem

RECALL_K = 10
DEEP_K = 20
FrameworkFactory = Callable[[str, DatasetItem, Any], MemoryFramework]
Hook = Callable[[Any], None]


@dataclass(frozen=True)
class Unit:
    """One persona × framework of a run: what to evaluate (the persona's history travels beside it)."""

    dataset_kind: str
    framework: str
    persona: str
    limit: int | None = None
    respond: bool = True

    @property
    def name(self) -> str:
        """Return ``framework/persona``."""
        return f"{self.framework}/{self.persona}"


@dataclass(frozen=True)
class JudgePlan:
    """How a unit's judges run, buildable in any process: the judge model (spec or object), offline or one LangSmith experiment."""

    model: Any
    dataset_name: str
    experiment_prefix: str
    upload: bool = False
    experiment_id: str | None = None

    def build(self, dataset_kind: str, settings: Settings) -> Judging:
        """Return the judging of this plan (an uploading one reopens the run's experiment by id)."""
        judges = judges_for(
            dataset_kind, self.model, settings=settings, repetitions=settings.evaluation.judge_repetitions
        )
        if not self.upload:
            return Judging(judges, dataset_name=self.dataset_name, experiment_prefix=self.experiment_prefix)
        import langsmith

        client = langsmith.Client()
        return Judging(
            judges,
            upload=True,
            client=client,
            experiment=client.read_project(project_id=self.experiment_id),
            dataset_id=client.read_dataset(dataset_name=self.dataset_name).id,
            dataset_name=self.dataset_name,
            experiment_prefix=self.experiment_prefix,
        )


@dataclass
class UnitEnv:
    """What every unit of a run shares (see the module docstring); ``records`` and ``stores`` are per framework."""

    settings: Settings
    records: Mapping[str, RunRecord]
    stores: Mapping[str, str]
    chat: Any = None  # a chat model object or spec shared by frameworks (None: from settings)
    embeddings: Any = None  # an embeddings object (None: the embedder setting's)
    similarity: Any = None  # the embedder of similarity metrics (None: eval_embedder, else the store's embedder)
    judges: Mapping[str, JudgePlan | Judging] = field(default_factory=dict)  # per framework; empty: no judges
    framework_factory: FrameworkFactory | None = None
    on_record: Hook | None = None
    on_ingest: Hook | None = None
    on_judged: Hook | None = None
    _built: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:  # hooks and built models stay in the process that made them
        return {**self.__dict__, "on_record": None, "on_ingest": None, "on_judged": None, "_built": {}}

    def with_(self, **settings: Any) -> UnitEnv:
        """Return a copy whose settings have ``settings`` changed (a framework factory's variant of the run's)."""
        return dataclasses.replace(self, settings=self.settings.replace(**settings))

    def chat_model(self) -> Any:
        """Return the shared chat model object (None: frameworks build theirs from the settings)."""
        if isinstance(self.chat, str):
            if "chat" not in self._built:
                from dualmem.models import load_chat_model

                self._built["chat"] = load_chat_model(self.chat, self.settings)
            return self._built["chat"]
        return self.chat

    def similarity_embedder(self) -> Any:
        """Return the embedder of similarity metrics (default: ``eval_embedder``, else the store's embedder)."""
        if self.similarity is None:
            from dualmem.models import load_embeddings

            self.similarity = (
                self.embeddings
                if not self.settings.evaluation.eval_embedder and self.embeddings is not None
                else load_embeddings(self.settings.evaluation.eval_embedder or None, self.settings)
            )
        return self.similarity

    def judging(self, unit: Unit) -> Judging | None:
        """Return the judges of ``unit``'s framework (None without judges), built once per process."""
        plan = self.judges.get(unit.framework) if unit.respond else None
        if plan is None or isinstance(plan, Judging):
            return plan
        key = f"judging:{unit.framework}"
        if key not in self._built:
            self._built[key] = plan.build(unit.dataset_kind, self.settings)
        return self._built[key]


def persona_store(base: str, item: DatasetItem) -> str:
    """Return the persona's own store folder under ``base`` (never starting with ``_`` or ``.``: no run record's)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", item.dialogue.id).strip("._") or "persona"
    return f"{base.rstrip('/')}/{safe}"


def default_framework(name: str, item: DatasetItem, env: UnitEnv) -> MemoryFramework:
    """Open framework ``name`` on the persona's namespace and store folder, with the memory an earlier attempt left."""
    namespace = (item.dialogue.id, item.dialogue.user_id or env.settings.user)
    return open_framework(
        name,
        FrameworkContext(
            namespace=namespace,
            settings=env.settings,
            persona=item.dialogue.persona,
            chat_model=env.chat_model(),
            embeddings=env.embeddings,
            store_uri=persona_store(env.stores[name], item),
        ),
    )


def run_unit(unit: Unit, item: DatasetItem, env: UnitEnv) -> dict[str, Any]:
    """Run one unit; record it finished (with its result) unless a call failed; return ``{persona, records, ingest,
    cost}``, ``cost`` the unit's model calls per phase over every attempt (:mod:`dualmem.evals.cost`).

    The caller schedules only units the record does not hold finished; a unit run again anyway (a replay) calls no
    model for any step it recorded, and its second result row is ignored by readers."""
    record = env.records[unit.framework]
    steps = record.steps(unit.framework, unit.persona)
    steps.meter = meter = Meter()
    factory = env.framework_factory or default_framework
    framework = factory(unit.framework, item, env)
    opts = RunOptions(
        # RoleMemo scores the top-10 of one retrieve(query, 10); RealMem / LoCoMo need depth 20 for @20
        retrieve_k=RECALL_K if unit.dataset_kind == "rolememo" else max(DEEP_K, env.settings.tuning.retrieval_k),
        recall_k=RECALL_K,
        respond_k=env.settings.tuning.retrieval_k,
        respond=unit.respond,
        limit=unit.limit,
        embed=env.similarity_embedder() if unit.dataset_kind in ("rolememo", "realmem") else None,
        journal=steps,
        on_record=env.on_record,
        on_ingest=env.on_ingest,
    )
    # a fresh context: graphs a framework invokes inside (respond, writers) must not inherit the evaluate graph's
    # checkpointer and thread, or a re-run unit would replay their earlier checkpoints instead of calling models
    result = contextvars.Context().run(meter.run, run_item, unit.dataset_kind, item, framework, opts)
    judging = env.judging(unit)
    if judging is not None:
        with meter.counting("judging"):
            result["records"] = judging.judge(result["records"], persona_text(item), steps, env.on_judged)
        judging.flush()
    steps.spend()
    result["cost"] = {"phases": _summed(steps.spent()), "history_tokens": history_tokens(item, result["ingest"])}
    if _complete(result, steps, judging):
        record.finish(unit.framework, unit.persona, result)
    return result


def _summed(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in rows:
        add(out, row)
    return out


def history_tokens(item: DatasetItem, ingest: list[dict[str, Any]]) -> int:
    """Return the tokens of the turns of the sessions a unit ingested (what its writer read)."""
    done = {row["session"] for row in ingest if "error" not in row}
    texts = [t.text for s in item.dialogue.sessions if s.id in done for t in s.turns]
    return sum(count_tokens_batch(texts)) if texts else 0


def replay_hooks(env: UnitEnv, unit: Unit, result: Mapping[str, Any]) -> None:
    """Advance the progress hooks for a unit read back finished from the record."""
    judged = unit.respond and unit.framework in env.judges
    answered = [r for r in result["records"] if r.get("answer") is not None]
    plan: list[tuple[Hook | None, list[Any]]] = [
        (env.on_ingest, result["ingest"]),
        (env.on_record, result["records"]),
        (env.on_judged if judged else None, answered),
    ]
    for hook, rows in plan:
        if hook is not None:
            for row in rows:
                hook(row)


def _complete(result: Mapping[str, Any], steps: Any, judging: Judging | None) -> bool:
    """Return whether a unit is final: every session ingested, query answered and verdict given (a call that failed is
    asked again when the unit runs again, so such a unit is not recorded finished)."""
    if any("error" in row for row in result["ingest"]):
        return False
    records = result["records"]
    if any(e.startswith(FAILED_CALLS) for r in records for e in r.get("errors", [])):
        return False
    names = [getattr(j, "__name__", "judge") for j in judging.judges] if judging is not None else []
    return all(
        steps.judgement(r["query_id"], n) is not None for r in records if r.get("answer") is not None for n in names
    )


class Runner(Protocol):
    """Where units run: ``run`` blocks the calling branch until its unit is done and returns the result."""

    def run(self, unit: Unit, item: DatasetItem) -> dict[str, Any]:
        """Run ``unit`` on ``item`` (its persona's history); return its result."""
        ...


class InProcess:
    """Run units in the calling thread (the evaluate graph's branch) of this process."""

    def __init__(self, env: UnitEnv) -> None:
        self.env = env

    def run(self, unit: Unit, item: DatasetItem) -> dict[str, Any]:
        """Run ``unit`` here."""
        return run_unit(unit, item, self.env)


@dataclass
class EvalRun:
    """An evaluation's run resources, handed to the evaluate graph as ``Context.run``: the units' environment, the
    runner, and the units the record held finished when the run began (``(framework, persona) -> result``)."""

    env: UnitEnv
    runner: Runner
    finished: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def example_records(items: Sequence[DatasetItem], dataset_kind: str, limit: int | None) -> list[dict[str, Any]]:
    """Return record-like dicts of every query of the run (what LangSmith examples are made of)."""
    return [
        {
            "persona": it.dialogue.id,
            "query_id": q.id,
            "query": q.text,
            "reference_answer": q.answer,
            "gold": q.gold.model_dump(),
            "task_type": q.task_type,
            "category": q.category,
            "protocol": dataset_kind,
        }
        for it in items
        for q in kept_queries(it, limit)
    ]


def open_judge_plans(
    runs: Sequence[tuple[Any, ...]],
    judge_model: Any,
    items: Sequence[DatasetItem],
    *,
    dataset_kind: str,
    path: str,
    limit: int | None,
    upload: bool,
) -> dict[str, JudgePlan]:
    """Open each framework's judging (its LangSmith experiment, kept in its ``run.json`` for a resume); return the
    plans by framework. ``runs`` holds ``(name, spec, run_dir, run, store, record)`` per framework."""
    judges: dict[str, JudgePlan] = {}
    for name, spec, run_dir, run, _store, _record in runs:
        judging = ls.open_judging(
            [],
            upload=upload,
            dataset_name=ls.dataset_name_for(dataset_kind, path),
            example_records=example_records(items, dataset_kind, limit) if upload else [],
            persona_texts={it.dialogue.id: persona_text(it) for it in items},
            experiment_name=f"dualmem-{run_dir.name}",
            experiment_id=run.get("langsmith_experiment"),
            metadata={
                "framework": name,
                "dataset": dataset_kind,
                "path": path,
                "limit": limit,
                "chat_model": spec.chat_model,
                "judge_model": spec.judge_model,
                "run": run["fingerprint"],
            },
        )
        if judging.experiment is not None and not run.get("langsmith_experiment"):
            run["langsmith_experiment"] = str(judging.experiment.id)
            write_run(run_dir, run)
        judges[name] = JudgePlan(
            judge_model,
            judging.dataset_name,
            judging.experiment_prefix,
            upload=judging.upload,
            experiment_id=str(judging.experiment.id) if judging.experiment is not None else None,
        )
    return judges


@contextmanager
def cancel_on_interrupt(runner: Any) -> Iterator[None]:
    """While inside, Ctrl-C cancels a cluster run's units at once (the graph otherwise waits for branches in flight)."""
    if not hasattr(runner, "close") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        runner.close(cancel=True)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
