"""The evaluation graph: dataset × framework → per-persona fan-out → score → aggregate.

``plan`` loads the dataset and lists its personas (histories); ``Send`` fans
out one ``run_persona`` branch per persona (bounded by the
``max_concurrency`` of the run config, :func:`dualmem.evals.run.run_eval`
sets it from ``Settings.concurrency``); each builds the framework for the
persona's namespace and runs the protocol runner — ingest, retrieve / respond
per query, metrics (RealMem interleaves ingest and queries, so these live in
one node) — then sends its records to ``judge_persona`` (LLM judges);
``aggregate`` summarises. Under a checkpointer a crashed run resumes:
finished branches are kept from the checkpoint and not recomputed, and a
crash while judging never redoes ingestion.

Context: :class:`EvalContext` (models, embedders, judges, store), or
``Settings`` / a dict of settings (the declared context schema, what
``langgraph dev`` passes), or nothing (defaults from the environment).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Send
from typing_extensions import TypedDict

from dualmem.config import Settings
from dualmem.datasets import load_dataset
from dualmem.evals.judges import Evaluator, judges_for
from dualmem.evals.runners import RunOptions, judge_record, persona_text, run_item
from dualmem.evals.summary import summarize
from dualmem.frameworks import FrameworkContext, MemoryFramework, open_framework
from dualmem.models import load_embeddings
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


class JudgeTask(TypedDict):
    """The payload of one judging branch: the persona task and its unjudged result."""

    task: PersonaTask
    result: dict[str, Any]


FrameworkFactory = Callable[[str, DatasetItem, "EvalContext"], MemoryFramework]


@dataclass
class EvalContext:
    """Run resources: settings, shared models, similarity embedder, judges, store and progress hooks."""

    settings: Settings = field(default_factory=Settings)
    chat_model: Any = None
    embeddings: Any = None
    similarity: Any = None
    judge: Any = None
    judges: list[Evaluator] | None = None
    judge_repetitions: int = 3
    store_uri: str | None = None
    framework_factory: FrameworkFactory | None = None
    on_record: Callable[[dict[str, Any]], None] | None = None
    on_ingest: Callable[[Any], None] | None = None
    on_judged: Callable[[dict[str, Any]], None] | None = None

    def similarity_embedder(self) -> Any:
        """Return the embedder of similarity metrics (default: the settings' embedder)."""
        if self.similarity is None:
            self.similarity = load_embeddings(self.embeddings, self.settings)
        return self.similarity

    def judge_functions(self, dataset_kind: str) -> list[Evaluator]:
        """Return the judges of ``dataset_kind`` (none unless a judge model or judges were given)."""
        if self.judges is None:
            self.judges = [] if self.judge is None else judges_for(
                dataset_kind, self.judge, settings=self.settings, repetitions=self.judge_repetitions)
        return self.judges


def as_context(ctx: EvalContext) -> Settings:
    """Return ``ctx`` typed as the graph's declared context (nodes accept both, see :func:`eval_context`)."""
    return cast(Settings, ctx)


def eval_context(context: Any) -> EvalContext:
    """Return an :class:`EvalContext` from a runtime context (object, settings dict or None)."""
    if isinstance(context, EvalContext):
        return context
    if isinstance(context, Settings):
        return EvalContext(settings=context)
    return EvalContext(settings=Settings.resolve(dict(context or {})))


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


def default_framework(name: str, item: DatasetItem, ctx: EvalContext) -> MemoryFramework:
    """Build framework ``name`` for the persona's namespace, starting from empty memory."""
    namespace = (item.dialogue.id, item.dialogue.user_id or ctx.settings.user_id)
    fw = open_framework(name, FrameworkContext(namespace=namespace, settings=ctx.settings, persona=item.dialogue.persona,
                                               chat_model=ctx.chat_model, embeddings=ctx.embeddings,
                                               store_uri=persona_store(ctx.store_uri or ctx.settings.store_uri, item)))
    try:
        fw.reset()  # a branch re-run after a crash must not see half-ingested memory
    except NotImplementedError:
        pass
    return fw


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


def run_persona(state: PersonaTask, runtime: Runtime[Settings]) -> Command[Literal["judge_persona"]]:
    """Ingest the persona's history, retrieve (and answer) its queries, compute the metrics; hand over to judging."""
    task = state
    ctx = eval_context(runtime.context)
    item = persona_item(task["dataset_kind"], task["path"], task["persona"])
    factory = ctx.framework_factory or default_framework
    framework = factory(task["framework"], item, ctx)
    needs_embed = task["dataset_kind"] in ("rolememo", "realmem")
    opts = RunOptions(
        # RoleMemo scores the top-10 of one retrieve(query, 10); RealMem / LoCoMo need depth 20 for @20
        retrieve_k=RECALL_K if task["dataset_kind"] == "rolememo" else max(DEEP_K, ctx.settings.retrieval_k),
        recall_k=RECALL_K,
        respond_k=ctx.settings.retrieval_k,
        respond=task["respond"],
        limit=task["limit"],
        embed=ctx.similarity_embedder() if needs_embed else None,
        on_record=ctx.on_record,
        on_ingest=ctx.on_ingest,
    )
    result = run_item(task["dataset_kind"], item, framework, opts)
    return Command(goto=Send("judge_persona", JudgeTask(task=task, result=result)))


def judge_persona(state: JudgeTask, runtime: Runtime[Settings]) -> dict[str, Any]:
    """Score the persona's answers with the LLM judges (a separate step: a judge crash never redoes ingest)."""
    ctx = eval_context(runtime.context)
    task, result = state["task"], state["result"]
    judges = ctx.judge_functions(task["dataset_kind"]) if task["respond"] else []
    if judges:
        text = persona_text(persona_item(task["dataset_kind"], task["path"], task["persona"]))
        records = []
        for rec in result["records"]:
            records.append(judge_record(rec, judges, text))
            if ctx.on_judged:
                ctx.on_judged(rec)
        result = {**result, "records": records}
    return {"results": [result]}


def aggregate(state: EvalState) -> dict[str, Any]:
    """Summarise every persona's records."""
    results = sorted(state.get("results") or [], key=lambda r: r["persona"])
    records = [rec for r in results for rec in r["records"]]
    ingest = {r["persona"]: r["ingest"] for r in results}
    return {"summary": summarize(state["dataset_kind"], records, ingest)}


builder = StateGraph(EvalState, context_schema=Settings)  # run_eval passes an EvalContext
builder.add_node("plan", plan)
builder.add_node("run_persona", run_persona, input_schema=PersonaTask, destinations=("judge_persona",))
builder.add_node("judge_persona", judge_persona, input_schema=JudgeTask)
builder.add_node("aggregate", aggregate)
builder.add_edge(START, "plan")
builder.add_conditional_edges("plan", fan_out, ["run_persona"])
builder.add_edge("judge_persona", "aggregate")
builder.add_edge("aggregate", END)
graph = builder.compile()
