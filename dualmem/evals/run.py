"""What ``dualmem eval`` and ``dualmem eval compare`` call: run one evaluation, compare runs.

:func:`run_eval` drives the evaluate graph under a SQLite checkpointer kept
in the run folder, so the same command run again after a crash resumes
(finished personas are not recomputed) and a finished run is only
re-reported. Progress is shown with rich bars (queries and sessions).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dualmem.config import Settings
from dualmem.datasets import KINDS
from dualmem.errors import ConfigurationError
from dualmem.evals.reports import RECORDS, compare_runs, read_summary, write_comparison, write_report
from dualmem.evals.runners import realmem_plan
from dualmem.evals.summary import ragas_crosscheck
from dualmem.graphs.evaluate import EvalContext, EvalState, as_context, builder, dataset
from dualmem.models import describe_embeddings, load_chat_model, model_name
from dualmem.schema import stable_id

CHECKPOINTS = "checkpoints.sqlite"


class _Advance:
    """Advance a progress task; when stderr is not a terminal (a log file, CI), also print a line now and then.

    Rich draws nothing live into a file, so a long run written to a log would
    show no progress until it ends: there, a plain line is printed for a task's
    first and last step and at most every ``every_s`` seconds in between.
    """

    def __init__(self, bar: Progress, console: Console, *, logging: bool, every_s: float = 30.0) -> None:
        self.bar, self.console, self.logging, self.every_s = bar, console, logging, every_s
        self._last: dict[Any, float] = {}

    def __call__(self, task_id: Any) -> None:
        self.bar.advance(task_id)
        if not self.logging:
            return
        task = next(t for t in self.bar.tasks if t.id == task_id)
        now = time.monotonic()
        done = task.total is not None and task.completed >= task.total
        if task_id in self._last and not done and now - self._last[task_id] < self.every_s:
            return
        self._last[task_id] = now
        total = "?" if task.total is None else int(task.total)
        self.console.print(f"{time.strftime('%H:%M:%S')} {task.description}: {int(task.completed)}/{total}", highlight=False)


def default_out(dataset_kind: str, framework: str) -> Path:
    """Return the default run folder ``runs/<dataset>-<framework>-<UTC time>``."""
    return Path("runs") / f"{dataset_kind}-{framework}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def _store_uri(settings: Settings, run_dir: Path) -> str:
    """Return the store of the run: the one set explicitly (--store / env), else ``<run>/lancedb``."""
    default = next(f.metadata["env_default"] for f in fields(Settings) if f.name == "store_uri")
    return settings.store_uri if settings.store_uri != default else str(run_dir / "lancedb")


def _totals(dataset_kind: str, path: str, limit: int | None, personas: Sequence[str] | None) -> tuple[int, int]:
    items = [it for it in dataset(dataset_kind, path).items if not personas or it.dialogue.id in personas]
    queries = sum(len(it.queries) if limit is None else min(limit, len(it.queries)) for it in items)
    if dataset_kind == "realmem" and limit is not None:  # replay stops before the session of the last query
        return queries, sum(max(0, len(realmem_plan(it, limit)[0]) - 1) for it in items)
    return queries, sum(len(it.dialogue.sessions) for it in items)


def run_eval(
    dataset_kind: str,
    path: str | Path,
    framework: str,
    *,
    judge: Any = None,
    limit: int | None = None,
    out: str | Path | None = None,
    settings: Settings | dict[str, Any] | None = None,
    model: Any = None,
    respond: bool = True,
    embeddings: Any = None,
    similarity: Any = None,
    personas: Sequence[str] | None = None,
    judge_repetitions: int = 3,
    framework_factory: Any = None,
    progress: bool = True,
    ragas: bool = True,
) -> Path:
    """Evaluate ``framework`` on a dataset; write records, summary and reports into ``out``; return ``out``.

    ``judge`` is a model spec or object (None: no LLM judges); ``model`` the
    chat model shared by frameworks (None: from settings); ``similarity`` the
    embedder of similarity metrics (None: the settings' embedder). ``limit``
    keeps the first N queries of each history (RealMem replays only up to the
    session of the N-th query; LoCoMo and RoleMemo still ingest the whole
    history). Each persona writes to its own store folder under the run's
    store (``<out>/lancedb`` unless ``store_uri`` is set explicitly). ``ragas``
    recomputes the ID-based context recall/precision with ragas itself into
    ``summary["ragas"]``.
    """
    if dataset_kind not in KINDS:
        raise ConfigurationError(f"unknown dataset {dataset_kind!r}; use --dataset with one of {', '.join(KINDS)}")
    settings = Settings.resolve(settings)
    path = str(Path(path).expanduser())
    if not Path(path).exists():
        raise ConfigurationError(f"dataset path {path} does not exist; pass the file or folder of a {dataset_kind} dataset")
    run_dir = Path(out) if out else default_out(dataset_kind, framework)
    run_dir.mkdir(parents=True, exist_ok=True)
    if similarity is None and settings.eval_embedder:
        from dualmem.models import load_embeddings

        similarity = load_embeddings(settings.eval_embedder)
    chat = load_chat_model(model, settings) if model is not None else None
    judge_model = load_chat_model(judge, settings, role="judge") if judge is not None else None
    ctx = EvalContext(settings=settings, chat_model=chat, embeddings=embeddings, similarity=similarity, judge=judge_model,
                      judge_repetitions=judge_repetitions, store_uri=_store_uri(settings, run_dir),
                      framework_factory=framework_factory)
    inputs: EvalState = {"dataset_kind": dataset_kind, "path": path, "framework": framework, "limit": limit, "respond": respond,
              "personas": list(personas or [])}
    thread = stable_id(run_dir.resolve(), dataset_kind, path, framework, limit, respond, sorted(personas or []))
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "max_concurrency": settings.concurrency, "recursion_limit": 100}
    n_queries, n_sessions = _totals(dataset_kind, path, limit, personas)
    console = Console(stderr=True)
    conn = sqlite3.connect(str(run_dir / CHECKPOINTS), check_same_thread=False)
    try:
        runnable = builder.compile(checkpointer=SqliteSaver(conn))
        snapshot = runnable.get_state(config)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=not progress) as bar:
            advance = _Advance(bar, console, logging=progress and not console.is_terminal)
            q_task = bar.add_task(f"{framework} × {dataset_kind}: queries", total=n_queries)
            s_task = bar.add_task("sessions ingested", total=n_sessions)
            ctx.on_record = lambda _rec: advance(q_task)
            ctx.on_ingest = lambda _s: advance(s_task)
            if judge_model is not None and respond:
                j_task = bar.add_task("answers judged", total=n_queries)
                ctx.on_judged = lambda _rec: advance(j_task)
            if snapshot.next:  # interrupted earlier: resume, finished personas are kept
                console.print(f"resuming run {run_dir} ({len(snapshot.values.get('results') or [])} persona(s) done)")
                values = runnable.invoke(None, config, context=as_context(ctx))
            elif snapshot.values.get("summary"):
                values = snapshot.values
            else:
                values = runnable.invoke(inputs, config, context=as_context(ctx))
    finally:
        conn.close()
    summary = dict(values["summary"])
    summary["meta"] = {
        "dataset": dataset_kind,
        "path": path,
        "framework": framework,
        "chat_model": model_name(chat) if chat is not None else settings.chat_model,
        "judge_model": model_name(judge_model) if judge_model is not None else None,
        "judge_repetitions": judge_repetitions if judge_model is not None else None,
        "similarity_embedder": describe_embeddings(ctx.similarity) if ctx.similarity is not None else (settings.eval_embedder or settings.embedder),
        "limit": limit,
        "respond": respond,
        "retrieval_k": settings.retrieval_k,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    records = [rec for r in sorted(values.get("results") or [], key=lambda r: r["persona"]) for rec in r["records"]]
    if ragas:
        summary["ragas"] = ragas_crosscheck(records)
    write_report(run_dir, summary, records)
    console.print(f"wrote {run_dir / RECORDS}, summary.json, report.md, report.html")
    return run_dir


def compare(run_dirs: Sequence[str | Path], out: str | Path | None = None, *, console: Console | None = None) -> str:
    """Print several runs side by side (rich table); write comparison.md/.html into ``out`` if given; return markdown."""
    for d in run_dirs:
        read_summary(d)  # clear error for a folder that is not a run
    comparison = compare_runs(run_dirs)
    (console or Console()).print(comparison.rich_table())
    if out is not None:
        write_comparison(comparison, out)
    return comparison.markdown()
