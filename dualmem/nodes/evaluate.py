"""Nodes of the evaluate graph: list the units, run each where the run's runner puts it, summarise per framework.

``plan`` loads the dataset and lists its personas and the frameworks;
``fan_out`` sends one ``run_unit`` branch per persona × framework (bounded by
the run config's ``max_concurrency``: ``Settings.evaluation.concurrency`` units in
flight); ``run_unit`` returns a unit finished in the run record from it, else
hands the unit to the run's runner — this process's thread
(:func:`dualmem.evals.unit.run_unit`) or a Ray worker
(:mod:`dualmem.evals.cluster`) — and waits; ``aggregate`` summarises each
framework's records.

Context: :class:`~dualmem.context.Context`; its ``run`` holds the run's
:class:`~dualmem.evals.unit.EvalRun` when :func:`dualmem.evaluate.run_eval`
drives the graph. Without one (``langgraph dev``, a plain ``graph.invoke``)
units run in this process against the ``store_uri`` setting's store, with
their record under it (``_runs/graph-<id>``), and no judges.
"""

from __future__ import annotations

import operator
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from langgraph.runtime import Runtime
from langgraph.types import Send
from typing_extensions import TypedDict

from dualmem.context import Context, context_of
from dualmem.datasets import load_dataset
from dualmem.evals.record import RunRecord, record_uri
from dualmem.evals.summary import summarize
from dualmem.evals.unit import EvalRun, InProcess, Unit, UnitEnv, replay_hooks
from dualmem.schema import Dataset, DatasetItem, stable_id


class EvalState(TypedDict, total=False):
    """State of the evaluate graph (inputs: dataset_kind, path, framework or frameworks, optional limit / respond / personas)."""

    dataset_kind: str
    path: str
    framework: str
    frameworks: list[str]
    limit: int | None
    respond: bool
    personas: list[str]
    results: Annotated[list[dict[str, Any]], operator.add]
    summaries: dict[str, dict[str, Any]]
    summary: dict[str, Any]


class UnitTask(TypedDict):
    """The payload of one fan-out branch: one persona × framework."""

    dataset_kind: str
    path: str
    framework: str
    limit: int | None
    respond: bool
    persona: str


@lru_cache(maxsize=4)
def _dataset(kind: str, path: str, mtime: float) -> Dataset:
    return load_dataset(kind, path)


def dataset(kind: str, path: str) -> Dataset:
    """Load (and cache while unchanged) the dataset of ``kind`` at ``path``."""
    p = Path(path)
    return _dataset(kind, str(p), p.stat().st_mtime if p.exists() else 0.0)


def persona_item(kind: str, path: str, persona: str) -> DatasetItem:
    """Return the history ``persona`` (a dialogue id) of a dataset."""
    for item in dataset(kind, path).items:
        if item.dialogue.id == persona:
            return item
    raise ValueError(f"persona {persona!r} is not in {path}; list them with `dualmem data`")


def frameworks_of(state: EvalState) -> list[str]:
    """Return the frameworks a run evaluates (``frameworks``, else ``framework``)."""
    names = list(state.get("frameworks") or ([state["framework"]] if state.get("framework") else []))
    if not names:
        raise ValueError("the evaluate graph needs framework (or frameworks); see `dualmem frameworks`")
    return names


def plan(state: EvalState) -> dict[str, Any]:
    """List the personas to evaluate (all histories unless ``personas`` is given) and the frameworks."""
    ids = [it.dialogue.id for it in dataset(state["dataset_kind"], state["path"]).items]
    wanted = state.get("personas")
    if wanted:
        missing = sorted(set(wanted) - set(ids))
        if missing:
            raise ValueError(f"personas {missing} are not in {state['path']}; available: {ids[:10]}")
        ids = [i for i in ids if i in wanted]
    if not ids:
        raise ValueError(
            f"{state['path']} holds no {state['dataset_kind']} history to evaluate; check the path and --dataset"
        )
    return {"personas": ids, "frameworks": frameworks_of(state)}


def fan_out(state: EvalState) -> list[Send]:
    """Send one branch per persona × framework (persona by persona, so each persona's frameworks start together)."""
    return [
        Send(
            "run_unit",
            UnitTask(
                dataset_kind=state["dataset_kind"],
                path=state["path"],
                framework=fw,
                limit=state.get("limit"),
                respond=state.get("respond", True),
                persona=p,
            ),
        )
        for p in state["personas"]
        for fw in state["frameworks"]
    ]


def _default_run(ctx: Context, task: UnitTask) -> EvalRun:
    """Return the run resources of a graph invoked without any: in-process units, a record under ``store_uri``."""
    settings = ctx.settings
    name = (
        f"graph-{stable_id(task['dataset_kind'], str(Path(task['path']).resolve()), task['framework'], task['limit'])}"
    )
    env = UnitEnv(
        settings=settings,
        records={task["framework"]: RunRecord(record_uri(settings.store_uri, name), settings.store_options)},
        stores={task["framework"]: settings.store_uri},
        chat=(ctx.models or {}).get("chat"),
        embeddings=ctx.embeddings,
    )
    return EvalRun(env=env, runner=InProcess(env))


def run_unit(state: UnitTask, runtime: Runtime[Context]) -> dict[str, Any]:
    """Run one persona × framework (or read it back finished from the run record)."""
    ctx = context_of(runtime)
    run = ctx.run if isinstance(ctx.run, EvalRun) else _default_run(ctx, state)
    unit = Unit(
        dataset_kind=state["dataset_kind"],
        framework=state["framework"],
        persona=state["persona"],
        limit=state["limit"],
        respond=state["respond"],
    )
    done = run.finished.get((unit.framework, unit.persona))
    if done is not None:
        replay_hooks(run.env, unit, done)
        result = done
    else:
        result = run.runner.run(unit, persona_item(unit.dataset_kind, state["path"], unit.persona))
    return {"results": [{**result, "framework": unit.framework}]}


def aggregate(state: EvalState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Summarise each framework's records and what its calls cost (``summary``: the first framework's)."""
    summaries = {}
    prices = context_of(runtime).settings.evaluation.prices
    for fw in state["frameworks"]:
        results = sorted((r for r in state.get("results") or [] if r["framework"] == fw), key=lambda r: r["persona"])
        records = [rec for r in results for rec in r["records"]]
        summaries[fw] = summarize(
            state["dataset_kind"],
            records,
            {r["persona"]: r["ingest"] for r in results},
            cost={r["persona"]: r.get("cost") for r in results},
            prices=prices,
        )
    return {"summaries": summaries, "summary": summaries[state["frameworks"][0]]}
