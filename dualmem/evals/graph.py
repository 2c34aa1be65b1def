"""The evaluation graph: dataset × framework → per-persona fan-out → score → aggregate.

``plan`` loads the dataset and lists its personas (histories); ``Send`` fans
out one ``run_persona`` branch per persona (bounded by the
``max_concurrency`` of the run config, :func:`dualmem.evals.run.run_eval`
sets it from ``Settings.concurrency``); each opens the framework for the
persona's namespace (its memory as a previous attempt left it: nothing is
reset) and runs the protocol runner — ingest, retrieve / respond per query,
metrics (RealMem interleaves ingest and queries, so these live in one node) —
then the LLM judges through ``langsmith.evaluate``, in the same branch, so one
persona's judging never waits for another's ingestion; ``aggregate``
summarises. With a journal (:mod:`dualmem.evals.journal`) a re-run resumes
mid-persona: ingested sessions, answered queries and judge verdicts are read
back, not recomputed. When :func:`dualmem.evals.run.run_eval` gives the run
worker processes (:mod:`dualmem.evals.workers`), a branch hands everything
but the judges (:func:`persona_result`) to a worker and waits for it.
Frameworks run in a fresh context, so graphs they
invoke never inherit this graph's checkpointer (under ``langgraph dev`` or any
checkpointer, a re-run branch would otherwise replay their old checkpoints).

Context: :class:`~dualmem.context.Context` (``langgraph dev`` passes a dict of
settings); its ``run`` field holds the run's :class:`EvalRun` (similarity
embedder, judges, journal, store folder, progress hooks) when
:func:`dualmem.evals.run.run_eval` drives the graph.
"""

from __future__ import annotations

import contextvars
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send
from typing_extensions import TypedDict

from dualmem.context import Context, context_of
from dualmem.datasets import load_dataset
from dualmem.evals.journal import Journal
from dualmem.evals.judges import Evaluator, judges_for
from dualmem.evals.langsmith_adapter import Judging
from dualmem.evals.runners import RunOptions, persona_text, run_item
from dualmem.evals.summary import summarize
from dualmem.frameworks import FrameworkContext, MemoryFramework, open_framework
from dualmem.schema import Dataset, DatasetItem

RECALL_K = 10
DEEP_K = 20


class EvalState(TypedDict, total=False):
    """State of the evaluate graph (inputs: dataset_kind, path, framework, optional limit / respond / personas)."""

    dataset_kind: str
    path: str
    framework: str
    limit: int | None
    respond: bool
    personas: list[str]
    results: Annotated[list[dict[str, Any]], operator.add]
    summary: dict[str, Any]


class PersonaTask(TypedDict):
    """The payload of one fan-out branch."""

    dataset_kind: str
    path: str
    framework: str
    limit: int | None
    respond: bool
    persona: str


FrameworkFactory = Callable[[str, DatasetItem, Context], MemoryFramework]


@dataclass
class EvalRun:
    """An evaluation's run resources: similarity embedder, judges, journal, store folder and progress hooks."""

    similarity: Any = None
    judge: Any = None
    judges: list[Evaluator] | None = None
    judging: Judging | None = None
    journal: Journal | None = None
    store_uri: str | None = None
    framework_factory: FrameworkFactory | None = None
    on_record: Callable[[dict[str, Any]], None] | None = None
    on_ingest: Callable[[Any], None] | None = None
    on_judged: Callable[[Mapping[str, Any]], None] | None = None
    workers: Any = None  # a PersonaWorkers (dualmem.evals.workers): branches run in processes of their own

    def similarity_embedder(self, ctx: Context) -> Any:
        """Return the embedder of similarity metrics (default: ``eval_embedder``, else the context's embedder)."""
        if self.similarity is None:
            if ctx.settings.eval_embedder:
                from dualmem.models import load_embeddings

                self.similarity = load_embeddings(ctx.settings.eval_embedder)
            else:
                self.similarity = ctx.load_embedder()
        return self.similarity

    def judge_functions(self, dataset_kind: str, ctx: Context) -> list[Evaluator]:
        """Return the judges of ``dataset_kind`` (none unless a judge model or judges were given)."""
        if self.judges is None:
            self.judges = [] if self.judge is None else judges_for(
                dataset_kind, self.judge, settings=ctx.settings, repetitions=ctx.settings.judge_repetitions)
        return self.judges

    def judging_for(self, dataset_kind: str, ctx: Context) -> Judging | None:
        """Return how judges run (offline ``langsmith.evaluate`` unless the run set up an upload); None without judges."""
        if self.judging is None and self.judge_functions(dataset_kind, ctx):
            self.judging = Judging(self.judge_functions(dataset_kind, ctx), dataset_name=f"dualmem-{dataset_kind}")
        return self.judging


@lru_cache(maxsize=4)
def _dataset(kind: str, path: str, mtime: float) -> Dataset:  # noqa: ARG001 - mtime invalidates the cache
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


def persona_store(base: str, item: DatasetItem) -> str:
    """Return the persona's own store folder under ``base`` (parallel branches never share a LanceDB table)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", item.dialogue.id).strip("._") or "persona"
    return f"{base.rstrip('/')}/{safe}"


def default_framework(name: str, item: DatasetItem, ctx: Context) -> MemoryFramework:
    """Open framework ``name`` on the persona's namespace and store folder, with the memory an earlier attempt left.

    Nothing is reset: a resumed run continues the ingestion it had begun (the
    framework's own ledger skips what was applied), and a fresh run starts
    from an empty folder.
    """
    run = ctx.run if isinstance(ctx.run, EvalRun) else EvalRun()
    given = dict(ctx.models or {})
    namespace = (item.dialogue.id, item.dialogue.user_id or ctx.settings.user_id)
    return open_framework(name, FrameworkContext(namespace=namespace, settings=ctx.settings, persona=item.dialogue.persona,
                                                 chat_model=given.get("chat"), writer_model=given.get("writer"), embeddings=ctx.embeddings,
                                                 store_uri=persona_store(run.store_uri or ctx.settings.store_uri, item)))


def plan(state: EvalState) -> dict[str, Any]:
    """List the personas to evaluate (all histories unless ``personas`` is given)."""
    ids = [it.dialogue.id for it in dataset(state["dataset_kind"], state["path"]).items]
    wanted = state.get("personas")
    if wanted:
        missing = sorted(set(wanted) - set(ids))
        if missing:
            raise ValueError(f"personas {missing} are not in {state['path']}; available: {ids[:10]}")
        ids = [i for i in ids if i in wanted]
    if not ids:
        raise ValueError(f"{state['path']} holds no {state['dataset_kind']} history to evaluate; check the path and --dataset")
    return {"personas": ids}


def fan_out(state: EvalState) -> list[Send]:
    """Send one branch per persona."""
    return [
        Send("run_persona", PersonaTask(dataset_kind=state["dataset_kind"], path=state["path"],
                                        framework=state["framework"], limit=state.get("limit"),
                                        respond=state.get("respond", True), persona=p))
        for p in state["personas"]
    ]


def persona_result(task: PersonaTask, ctx: Context, run: EvalRun, item: DatasetItem | None = None) -> dict[str, Any]:
    """Ingest the persona's history, retrieve (and answer) its queries and compute the metrics (no judges)."""
    item = item or persona_item(task["dataset_kind"], task["path"], task["persona"])
    factory = run.framework_factory or default_framework
    framework = factory(task["framework"], item, ctx)
    needs_embed = task["dataset_kind"] in ("rolememo", "realmem")
    journal = run.journal.scope(task["persona"]) if run.journal is not None else None
    opts = RunOptions(
        # RoleMemo scores the top-10 of one retrieve(query, 10); RealMem / LoCoMo need depth 20 for @20
        retrieve_k=RECALL_K if task["dataset_kind"] == "rolememo" else max(DEEP_K, ctx.settings.retrieval_k),
        recall_k=RECALL_K,
        respond_k=ctx.settings.retrieval_k,
        respond=task["respond"],
        limit=task["limit"],
        embed=run.similarity_embedder(ctx) if needs_embed else None,
        journal=journal,
        on_record=run.on_record,
        on_ingest=run.on_ingest,
    )
    # a fresh context: graphs a framework invokes inside (respond, writers) must not inherit this graph's
    # checkpointer and thread, or a re-run branch would replay their earlier checkpoints instead of calling models
    return contextvars.Context().run(run_item, task["dataset_kind"], item, framework, opts)


def run_persona(state: PersonaTask, runtime: Runtime[Context]) -> dict[str, Any]:
    """Run one persona (in this process, or in a worker process when the run has workers), then its judges here."""
    task = state
    ctx = context_of(runtime)
    run = ctx.run if isinstance(ctx.run, EvalRun) else EvalRun()
    item = persona_item(task["dataset_kind"], task["path"], task["persona"])
    result = run.workers.run(task, item) if run.workers is not None else persona_result(task, ctx, run, item)
    judging = run.judging_for(task["dataset_kind"], ctx) if task["respond"] else None
    if judging is not None:
        journal = run.journal.scope(task["persona"]) if run.journal is not None else None
        result["records"] = judging.judge(result["records"], persona_text(item), journal, run.on_judged)
    return {"results": [result]}


def aggregate(state: EvalState) -> dict[str, Any]:
    """Summarise every persona's records."""
    results = sorted(state.get("results") or [], key=lambda r: r["persona"])
    records = [rec for r in results for rec in r["records"]]
    ingest = {r["persona"]: r["ingest"] for r in results}
    return {"summary": summarize(state["dataset_kind"], records, ingest)}


builder = StateGraph(EvalState, context_schema=Context)
builder.add_node("plan", plan)
builder.add_node("run_persona", run_persona, input_schema=PersonaTask)
builder.add_node("aggregate", aggregate)
builder.add_edge(START, "plan")
builder.add_conditional_edges("plan", fan_out, ["run_persona"])
builder.add_edge("run_persona", "aggregate")
builder.add_edge("aggregate", END)
graph = builder.compile()
