"""What ``dualmem eval`` and ``dualmem eval compare`` call: run (or resume) one evaluation, compare runs.

:func:`run_eval` claims a run folder for its :class:`~dualmem.evals.runspec.RunSpec`
(by default ``runs/<dataset>-<framework>-<fingerprint>``, so the same command
run again continues the same run), then drives the evaluate graph with the
journal kept in that folder: an interrupted persona continues where it
stopped — no ingested session, answered query or judge verdict is computed
twice — and a finished run is re-reported from the journal without a model
call. :func:`resume_eval` continues a run from its folder alone. Progress is
shown with rich bars.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import fields
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from rich.console import Console

from dualmem.config import Settings
from dualmem.context import context_of
from dualmem.datasets import KINDS
from dualmem.errors import ConfigurationError
from dualmem.evals import langsmith_adapter as ls
from dualmem.evals.compare import compare_runs, write_comparison
from dualmem.evals.graph import EvalRun, EvalState, dataset, graph
from dualmem.evals.journal import JOURNAL, Journal
from dualmem.evals.judges import judges_for
from dualmem.evals.metrics import load_ragas_id_metrics
from dualmem.evals.progress import progress_bars
from dualmem.evals.reports import RECORDS, read_summary, write_report
from dualmem.evals.runners import kept_queries, persona_text, realmem_plan
from dualmem.evals.runspec import (
    OPERATIONAL,
    RunSpec,
    claim,
    data_stamp,
    implied_writer,
    ranker_stamp,
    recorded_settings,
    spec_of,
    write_run,
)
from dualmem.evals.summary import ragas_crosscheck
from dualmem.evals.workers import PersonaWorkers, priorities, start_forkserver, workers_for
from dualmem.models import describe_embeddings, load_chat_model, model_name


def run_store(settings: Settings, run_dir: Path) -> str:
    """Return the store of the run: the one set explicitly (--store / env), else ``<run>/lancedb``."""
    default = next(f.metadata["env_default"] for f in fields(Settings) if f.name == "store_uri")
    return settings.store_uri if settings.store_uri != default else str(run_dir / "lancedb")


def _items(dataset_kind: str, path: str, personas: Sequence[str] | None) -> list[Any]:
    return [it for it in dataset(dataset_kind, path).items if not personas or it.dialogue.id in personas]


def _replayed(dataset_kind: str, item: Any, limit: int | None) -> list[Any]:
    """Return the sessions a persona's run ingests (RealMem with a limit: replay stops before the session of the last query)."""
    return realmem_plan(item, limit)[0][:-1] if dataset_kind == "realmem" and limit is not None else list(item.dialogue.sessions)


def _totals(dataset_kind: str, path: str, limit: int | None, personas: Sequence[str] | None) -> tuple[int, int]:
    items = _items(dataset_kind, path, personas)
    return sum(len(kept_queries(it, limit)) for it in items), sum(len(_replayed(dataset_kind, it, limit)) for it in items)


def _work(dataset_kind: str, path: str, limit: int | None, personas: Sequence[str] | None, chunk_tokens: int) -> dict[str, float]:
    """Return each persona's expected model calls: writer chunks (about 4 characters a token) and three per query."""
    out = {}
    for it in _items(dataset_kind, path, personas):
        chars = sum(len(t.text) for s in _replayed(dataset_kind, it, limit) for t in s.turns)
        out[it.dialogue.id] = chars / (4 * chunk_tokens) + 3 * len(kept_queries(it, limit))
    return out


def _example_records(dataset_kind: str, path: str, limit: int | None, personas: Sequence[str] | None) -> list[dict[str, Any]]:
    """Return record-like dicts of every query of the run (what LangSmith examples are made of)."""
    return [{"persona": it.dialogue.id, "query_id": q.id, "query": q.text, "reference_answer": q.answer,
             "gold": q.gold.model_dump(), "task_type": q.task_type, "category": q.category, "protocol": dataset_kind}
            for it in _items(dataset_kind, path, personas) for q in kept_queries(it, limit)]


def _name(model: Any) -> str | None:
    if model is None:
        return None
    return model if isinstance(model, str) else model_name(model)


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
    framework_factory: Any = None,
    progress: bool = True,
    ragas: bool = True,
    upload: bool | None = None,
) -> Path:
    """Evaluate ``framework`` on a dataset; write records, summary and reports into the run folder; return it.

    ``judge`` is a model spec or object (None: no LLM judges); ``model`` the
    chat model shared by frameworks (None: from settings); ``similarity`` the
    embedder of similarity metrics (None: ``eval_embedder``, else the
    settings' embedder). ``limit`` keeps the first N queries of each history
    (RealMem replays only up to the session of the N-th query; LoCoMo and
    RoleMemo still ingest the whole history). ``out`` is the run folder
    (default: deterministic, see :mod:`dualmem.evals.runspec`); a folder of the
    same run is continued, a folder of another run refused. Each persona writes
    to its own store folder under ``<out>/lancedb`` (or under ``store_uri`` when
    set explicitly). Judges run through ``langsmith.evaluate``: offline, or
    uploaded as one experiment when ``upload`` (default: a LangSmith key is set).
    ``ragas`` recomputes the ID-based context recall/precision with ragas itself.
    """
    if dataset_kind not in KINDS:
        raise ConfigurationError(f"unknown dataset {dataset_kind!r}; use --dataset with one of {', '.join(KINDS)}")
    settings = Settings.resolve(settings)
    path = str(Path(path).expanduser().resolve())
    if not Path(path).exists():
        raise ConfigurationError(f"dataset path {path} does not exist; pass the file or folder of a {dataset_kind} dataset")
    if ragas:  # importing ragas takes seconds: do it while the evaluation waits on models
        threading.Thread(target=load_ragas_id_metrics, name="dualmem-warm-ragas", daemon=True).start()
    respond_and_judge = respond and judge is not None
    writes = True  # a framework given as a factory may write with the writer model
    if framework_factory is None:  # a wrong name or embedder fails before the run folder is claimed
        from dualmem.frameworks import framework_class

        writes = framework_class(framework).uses_writer
    if embeddings is None:
        from dualmem.preflight import check_embedder

        check_embedder(settings)
    spec = RunSpec(dataset_kind=dataset_kind, path=path, framework=framework, limit=limit, respond=respond,
                   personas=sorted(personas or []), chat_model=_name(model) or settings.chat_model,
                   judge_model=_name(judge) if respond_and_judge else None, settings=recorded_settings(settings),
                   stamp=data_stamp(path), ranker_weights=ranker_stamp(settings), writer=implied_writer(settings, model) if writes else None)
    run_dir = Path(out) if out else spec.default_dir()
    run = claim(run_dir, spec)
    objects = any(x is not None for x in (embeddings, similarity, framework_factory)) or not isinstance(model, (str, type(None)))
    if workers_for(settings, 2, objects=objects):  # processes are likely: start their forkserver while the dataset loads
        start_forkserver(settings)
    n_workers = workers_for(settings, len(_items(dataset_kind, path, personas)), objects=objects)
    if similarity is None and settings.eval_embedder and not n_workers:  # once, before branches (threads) race to load it
        from dualmem.models import load_embeddings

        similarity = load_embeddings(settings.eval_embedder)
    chat = load_chat_model(model, settings) if model is not None else None
    judge_model = load_chat_model(judge, settings, role="judge") if respond_and_judge else None
    journal = Journal(run_dir / JOURNAL)
    ctx = EvalRun(similarity=similarity, judge=judge_model, journal=journal, store_uri=run_store(settings, run_dir),
                  framework_factory=framework_factory)
    if judge_model is not None:
        upload = ls.upload_enabled() if upload is None else upload
        items = _items(dataset_kind, path, personas)
        ctx.judging = ls.open_judging(
            judges_for(dataset_kind, judge_model, settings=settings), upload=upload,
            dataset_name=ls.dataset_name_for(dataset_kind, path),
            example_records=_example_records(dataset_kind, path, limit, personas) if upload else [],
            persona_texts={it.dialogue.id: persona_text(it) for it in items},
            experiment_name=f"dualmem-{run_dir.name}", experiment_id=run.get("langsmith_experiment"),
            metadata={"framework": framework, "dataset": dataset_kind, "path": path, "limit": limit,
                      "chat_model": spec.chat_model, "judge_model": spec.judge_model, "run": run["fingerprint"]})
        if ctx.judging.experiment is not None and not run.get("langsmith_experiment"):
            run["langsmith_experiment"] = str(ctx.judging.experiment.id)
            write_run(run_dir, run)
    inputs: EvalState = {"dataset_kind": dataset_kind, "path": path, "framework": framework, "limit": limit, "respond": respond,
                         "personas": list(personas or [])}
    config: RunnableConfig = {"max_concurrency": settings.concurrency, "recursion_limit": 100}
    n_queries, n_sessions = _totals(dataset_kind, path, limit, personas)
    console = Console(stderr=True)
    done = {kind: journal.count(kind) for kind in ("ingest", "record", "judge")}
    if any(done.values()):
        console.print(f"resuming run {run_dir}: {done['ingest']} sessions ingested, {done['record']} queries answered, "
                      f"{done['judge']} verdicts recorded before (not redone)")
    try:
        with progress_bars(console, enabled=progress) as (bar, advance):
            q_task = bar.add_task(f"{framework} × {dataset_kind}: queries", total=n_queries)
            s_task = bar.add_task("sessions ingested", total=n_sessions)
            ctx.on_record = lambda _rec: advance(q_task)
            ctx.on_ingest = lambda _s: advance(s_task)
            if judge_model is not None:
                j_task = bar.add_task("answers judged", total=n_queries)
                ctx.on_judged = lambda _rec: advance(j_task)
            if n_workers:
                ctx.workers = PersonaWorkers(n_workers, settings, chat_spec=model, journal_path=str(journal.path),
                                             store_uri=ctx.store_uri or "", on_record=ctx.on_record, on_ingest=ctx.on_ingest)
                if n_workers >= len(_items(dataset_kind, path, personas)) <= settings.concurrency:  # one worker each
                    ctx.workers.nice = priorities(_work(dataset_kind, path, limit, personas, settings.chunk_tokens))
            context = context_of(settings, models={"chat": chat} if chat is not None else None, embeddings=embeddings, run=ctx)
            with ctx.workers.interruptible() if ctx.workers is not None else nullcontext():
                values = graph.invoke(inputs, config, context=context)
    except BaseException as exc:
        if ctx.workers is not None:
            ctx.workers.close(cancel=True)
        if isinstance(exc, KeyboardInterrupt):
            console.print(f"interrupted: `dualmem eval --resume {run_dir}` (or the same command) continues this run")
        raise
    finally:
        if ctx.workers is not None:
            ctx.workers.close()
        journal.close()
        if ctx.judging is not None:
            ctx.judging.flush()
    summary = dict(values["summary"])
    summary["meta"] = _meta(spec, run, ctx, chat, judge_model, settings)
    records = [rec for r in sorted(values.get("results") or [], key=lambda r: r["persona"]) for rec in r["records"]]
    if ragas:
        summary["ragas"] = ragas_crosscheck(records)
    write_report(run_dir, summary, records)
    console.print(f"wrote {run_dir / RECORDS}, summary.json, report.md, report.html")
    return run_dir


def _meta(spec: RunSpec, run: dict[str, Any], ctx: EvalRun, chat: Any, judge_model: Any, settings: Settings) -> dict[str, Any]:
    """Return what the report says about the run: inputs, models, judges, LangSmith, settings, segments."""
    judging = ctx.judging
    langsmith: dict[str, Any] = {"mode": "off (no judges)"}
    if judging is not None:
        langsmith = {"mode": "uploaded" if judging.upload else "offline (upload_results=False)",
                     "dataset": judging.dataset_name, "experiment": getattr(judging.experiment, "name", None) or judging.experiment_prefix}
        url = getattr(judging.experiment, "url", None)
        if url:
            langsmith["url"] = url
    return {
        "dataset": spec.dataset_kind,
        "path": spec.path,
        "framework": spec.framework,
        "chat_model": model_name(chat) if chat is not None else settings.chat_model,
        "judge_model": model_name(judge_model) if judge_model is not None else "none (pass --judge MODEL)",
        "judge_repetitions": settings.judge_repetitions if judge_model is not None and spec.dataset_kind == "rolememo" else None,
        "similarity_embedder": describe_embeddings(ctx.similarity) if ctx.similarity is not None else (settings.eval_embedder or settings.embedder),
        "limit": spec.limit,
        "respond": spec.respond,
        "retrieval_k": settings.retrieval_k,
        "retrieval_mode": settings.retrieval_mode,
        "store": ctx.store_uri,
        "workers": f"{ctx.workers.n} processes" if ctx.workers is not None else "threads of one process",
        "langsmith": langsmith,
        "run": {"fingerprint": run["fingerprint"], "created": run["created"], "segments": len(run["segments"]),
                "dualmem_revision": run.get("dualmem_revision")},
        "settings": dict(spec.settings),
        "created": run["segments"][-1],
    }


def resume_eval(run_dir: str | Path, *, settings: dict[str, Any] | None = None, progress: bool = True,
                upload: bool | None = None) -> Path:
    """Continue (or re-report) the run kept in ``run_dir`` from its ``run.json``; ``settings`` may change operational ones."""
    spec = spec_of(run_dir)
    changed = sorted(k for k in (settings or {}) if k not in OPERATIONAL)
    if changed:
        raise ConfigurationError(f"--resume keeps the run's settings; {', '.join(changed)} would change its results "
                                 "(start another run instead)")
    resolved = Settings.resolve({**spec.settings, **(settings or {})})
    if spec.writer is None and implied_writer(resolved) is not None:  # begun when the chat model wrote: it goes on writing
        resolved = resolved.replace(writer_model=resolved.chat_model)
    return run_eval(spec.dataset_kind, spec.path, spec.framework, judge=spec.judge_model, limit=spec.limit, out=run_dir,
                    settings=resolved, model=None, respond=spec.respond, personas=spec.personas or None,
                    progress=progress, upload=upload)


def compare(run_dirs: Sequence[str | Path], out: str | Path | None = None, *, console: Console | None = None) -> str:
    """Print several runs side by side with deltas to the first (rich tables); write comparison files into ``out``; return markdown."""
    for d in run_dirs:
        read_summary(d)  # clear error for a folder that is not a run
    comparison = compare_runs(run_dirs)
    console = console or Console()
    for table in comparison.rich_tables():
        console.print(table)
    if out is not None:
        write_comparison(comparison, out)
    return comparison.markdown()
