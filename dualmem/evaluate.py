"""What ``dualmem eval`` calls: run (or resume) an evaluation in this process or on a Ray cluster; compare runs.

:func:`run_evals` claims a run folder per framework for its
:class:`~dualmem.evals.runspec.RunSpec` (by default
``runs/<dataset>-<framework>-<fingerprint>``, so the same command run again
continues the same runs), opens each run's record
(:mod:`dualmem.evals.record`, beside its stores: on object storage when the
store is), then drives the evaluate graph (:mod:`dualmem.graphs.evaluate`)
over every persona × framework unit: in threads of this process, or — with
``ray_address`` (``--ray``) — on a Ray cluster (:mod:`dualmem.evals.cluster`),
where this process only schedules, shows the bars and writes the reports.
Units the record holds finished are not run again; a unit cut short goes on
from its recorded steps, so no ingested session, answered query or judge
verdict is computed twice, whichever driver or machine resumes it.
:func:`resume_eval` continues a run from its folder, or from its record's URI
alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from rich.console import Console

from dualmem.config import Settings
from dualmem.context import context_of
from dualmem.datasets import KINDS, detect_kind
from dualmem.errors import ConfigurationError
from dualmem.evals import calibrate_run
from dualmem.evals import langsmith_adapter as ls
from dualmem.evals.calibration import calibrate
from dualmem.evals.compare import compare_runs, write_comparison
from dualmem.evals.cost import price_table
from dualmem.evals.meta import operational_here, run_meta
from dualmem.evals.progress import progress_bars
from dualmem.evals.record import RunRecord, record_uri
from dualmem.evals.reports import RECORDS, read_summary, write_report
from dualmem.evals.runners import kept_queries, realmem_plan
from dualmem.evals.runspec import (
    OPERATIONAL,
    RunSpec,
    claim,
    data_stamp,
    implied_writer,
    ranker_stamp,
    read_run,
    recorded_settings,
    run_store,
    settings_of,
    spec_of,
    write_run,
)
from dualmem.evals.summary import ragas_crosscheck
from dualmem.evals.unit import EvalRun, InProcess, Runner, UnitEnv, cancel_on_interrupt, open_judge_plans
from dualmem.graphs.evaluate import graph
from dualmem.models import load_chat_model, model_name
from dualmem.nodes.evaluate import EvalState, dataset


def _items(dataset_kind: str, path: str, personas: Sequence[str] | None) -> list[Any]:
    return [it for it in dataset(dataset_kind, path).items if not personas or it.dialogue.id in personas]


def _replayed(dataset_kind: str, item: Any, limit: int | None) -> list[Any]:
    """Return the sessions a persona's run ingests (RealMem with a limit: replay stops before the session of the last query)."""
    return (
        realmem_plan(item, limit)[0][:-1]
        if dataset_kind == "realmem" and limit is not None
        else list(item.dialogue.sessions)
    )


def _name(model: Any) -> str | None:
    if model is None:
        return None
    return model if isinstance(model, str) else model_name(model)


def _frameworks(framework: str | Sequence[str]) -> list[str]:
    names = [f.strip() for f in framework.split(",")] if isinstance(framework, str) else [str(f) for f in framework]
    names = [n for n in names if n]
    if not names or len(set(names)) != len(names):
        raise ConfigurationError(
            f"--framework {framework!r}: name one framework or several, comma-separated, each once"
        )
    return names


def run_eval(dataset_kind: str, path: str | Path, framework: str, **options: Any) -> Path:
    """Evaluate one framework (see :func:`run_evals`); return its run folder."""
    return run_evals(dataset_kind, path, [framework], **options)[0]


def run_evals(
    dataset_kind: str,
    path: str | Path,
    frameworks: str | Sequence[str],
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
    calibrate_judge: bool = False,
) -> list[Path]:
    """Evaluate each of ``frameworks`` on a dataset, all units scheduled together; write records, summary and reports
    into each framework's run folder; return the folders.

    ``dataset_kind`` is rolememo, realmem, locomo or auto (detected from the file). ``judge``
    is a model spec or object (None: no LLM judges); ``model`` the
    chat model shared by frameworks (None: from settings); ``similarity`` the
    embedder of similarity metrics (None: ``eval_embedder``, else the
    settings' embedder). ``limit`` keeps the first N queries of each history
    (RealMem replays only up to the session of the N-th query). ``out`` is the
    run folder (several frameworks: ``<out>/<framework>`` each; default:
    deterministic, see :mod:`dualmem.evals.runspec`); a folder of the same run
    is continued, a folder of another run refused. Each persona writes to its own
    store folder under ``<run>/lancedb``, or under ``store_uri`` when set
    explicitly (a Ray run's workers must all reach it: object storage or a
    shared folder). ``settings.ray_address`` runs the units on a Ray cluster;
    models, embedders and factories must then be given by name. Judges run
    through ``langsmith.evaluate``: offline, or uploaded when ``upload``
    (default: a LangSmith key is set); ``calibrate_judge`` first measures the
    judge's leniency on the dataset's gold answers (:mod:`dualmem.evals.calibration`),
    shown beside every judged score. ``ragas`` recomputes the ID-based context
    recall/precision with ragas itself. Each summary counts what the run's model
    calls cost (:mod:`dualmem.evals.cost`) and records what re-running it needs.
    """
    if dataset_kind != "auto" and dataset_kind not in KINDS:
        raise ConfigurationError(
            f"unknown dataset {dataset_kind!r}; use --dataset with auto or one of {', '.join(KINDS)}"
        )
    settings = Settings.resolve(settings)
    names = _frameworks(frameworks)
    path = str(Path(path).expanduser().resolve())
    if not Path(path).exists():
        raise ConfigurationError(f"dataset path {path} does not exist; pass the file or folder of a dataset")
    if dataset_kind == "auto":
        dataset_kind = detect_kind(path)
    cluster, owns = settings.ray_address, False
    if cluster:
        from dualmem.evals.cluster import connect, settings_need_specs

        given = {
            "model": model,
            "embeddings": embeddings,
            "similarity": similarity,
            "framework_factory": framework_factory,
        }
        settings_need_specs(
            settings,
            [k for k, v in given.items() if v is not None and not isinstance(v, str)]
            + (["judge"] if judge is not None and not isinstance(judge, str) else []),
        )
        owns = connect(cluster)  # a bad or unreachable address fails here, before anything slow
    respond_and_judge = respond and judge is not None
    if calibrate_judge and not respond_and_judge:
        raise ConfigurationError("--calibrate-judge measures the judge: pass --judge MODEL (and leave answering on)")
    if settings.evaluation.prices:
        price_table(settings.evaluation.prices)  # a malformed table is one line, before anything runs
    writes = {n: True for n in names}  # a framework given as a factory may write with the writer model
    if framework_factory is None:  # a wrong name or embedder fails before the run folder is claimed
        from dualmem.frameworks import framework_class

        writes = {n: framework_class(n).uses_writer for n in names}
    if embeddings is None:
        from dualmem.preflight import check_embedder

        check_embedder(settings)
    items = _items(
        dataset_kind, path, personas
    )  # a malformed file fails here, before a run folder or record is written
    runs = []
    for name in names:
        mine = settings.replace(framework=name) if len(names) > 1 else settings
        spec = RunSpec(
            dataset_kind=dataset_kind,
            path=path,
            framework=name,
            limit=limit,
            respond=respond,
            personas=sorted(personas or []),
            chat_model=_name(model) or settings.chat_model,
            judge_model=_name(judge) if respond_and_judge else None,
            settings=recorded_settings(mine),
            stamp=data_stamp(path),
            ranker_weights=ranker_stamp(settings),
            writer=implied_writer(settings, model) if writes[name] else None,
        )
        run_dir = (Path(out) / name if len(names) > 1 else Path(out)) if out else spec.default_dir()
        run = claim(run_dir, spec)
        if calibrate_judge and not run.get(
            "calibrate_judge"
        ):  # kept for --resume (not part of the spec: no result changes)
            run["calibrate_judge"] = True
            write_run(run_dir, run)
        store = run_store(settings, run_dir)
        record = RunRecord(record_uri(store, run["fingerprint"]), settings.store_options)
        record.write_spec(run)
        runs.append((name, spec, run_dir, run, store, record))
    if (
        similarity is None and settings.evaluation.eval_embedder and not cluster
    ):  # once, before branches (threads) race to load it
        from dualmem.models import load_embeddings

        similarity = load_embeddings(settings.evaluation.eval_embedder)
    chat = load_chat_model(model, settings) if model is not None and not cluster else model
    judges: dict[str, Any] = {}
    if respond_and_judge:
        judge_model = judge if cluster else load_chat_model(judge, settings, role="judge")
        judges = open_judge_plans(
            runs,
            judge_model,
            items,
            dataset_kind=dataset_kind,
            path=path,
            limit=limit,
            upload=ls.upload_enabled() if upload is None else upload,
        )
    calibration = (
        {
            **calibrate(
                dataset_kind, items, judge_model, settings, journal=runs[0][5].steps("_calibration", str(_name(judge)))
            ),
            "judge_model": _name(judge),
        }
        if calibrate_judge
        else None
    )
    env = UnitEnv(
        settings=settings,
        records={r[0]: r[5] for r in runs},
        stores={r[0]: r[4] for r in runs},
        chat=chat,
        embeddings=embeddings,
        similarity=similarity,
        judges=judges,
        framework_factory=framework_factory,
    )
    finished = {(name, p): res for name, *_rest, record in runs for p, res in record.finished(name).items()}
    inputs: EvalState = {
        "dataset_kind": dataset_kind,
        "path": path,
        "frameworks": names,
        "limit": limit,
        "respond": respond,
        "personas": list(personas or []),
    }
    config: RunnableConfig = {"max_concurrency": settings.evaluation.concurrency, "recursion_limit": 100}
    console = Console(stderr=True)
    units = len(items) * len(names)
    if any(len(r[3]["segments"]) > 1 for r in runs):
        console.print(
            f"resuming run {', '.join(str(r[2]) for r in runs)}: {len(finished)} of {units} units finished before "
            "(not redone); a unit cut short goes on from its recorded steps"
        )
    runner: Runner | None = None
    try:
        with progress_bars(console, enabled=progress) as (bar, advance):
            label = ",".join(names)
            q_task = bar.add_task(
                f"{label} × {dataset_kind}: queries",
                total=len(names) * sum(len(kept_queries(it, limit)) for it in items),
            )
            s_task = bar.add_task(
                "sessions ingested", total=len(names) * sum(len(_replayed(dataset_kind, it, limit)) for it in items)
            )
            env.on_record = lambda _rec: advance(q_task)
            env.on_ingest = lambda _s: advance(s_task)
            if judges:
                j_task = bar.add_task(
                    "answers judged", total=len(names) * sum(len(kept_queries(it, limit)) for it in items)
                )
                env.on_judged = lambda _rec: advance(j_task)
            if cluster and len(finished) < units:
                from dualmem.evals.cluster import RayRunner

                runner = RayRunner(env, cluster, units=units - len(finished), owns=owns)
            else:
                runner = InProcess(env)
            context = context_of(settings, run=EvalRun(env=env, runner=runner, finished=finished))
            with cancel_on_interrupt(runner):
                values = graph.invoke(inputs, config, context=context)
            where = runner.describe() if hasattr(runner, "describe") else "threads of one process"
            cluster_stats = runner.stats() if hasattr(runner, "stats") else None
            _release(runner, cluster and owns)
    except BaseException as exc:
        _release(runner, cluster and owns, cancel=True)
        if isinstance(exc, KeyboardInterrupt):
            console.print(f"interrupted: `dualmem eval --resume {runs[0][2]}` (or the same command) continues this run")
        raise
    for name, spec, run_dir, run, store, _record in runs:
        summary = dict(values["summaries"][name])
        summary["meta"] = run_meta(spec, run, env, store, settings, where)
        if cluster_stats is not None:
            summary["meta"]["cluster"] = cluster_stats
        if calibration is not None:
            summary["judge_calibration"] = calibration
        records = [
            rec
            for r in sorted(values["results"], key=lambda r: r["persona"])
            if r["framework"] == name
            for rec in r["records"]
        ]
        if ragas:
            summary["ragas"] = ragas_crosscheck(records)
        write_report(run_dir, summary, records, peers=values["summaries"] if len(names) > 1 else None)
        console.print(f"wrote {run_dir / RECORDS}, summary.json, report.md, report.html")
    return [r[2] for r in runs]


def _release(runner: Any, connected: Any, *, cancel: bool = False) -> None:
    """Close the run's runner (a Ray runner cancels its units when ``cancel``), else leave the cluster this run joined."""
    if runner is not None and hasattr(runner, "close"):
        runner.close(cancel=True) if cancel else runner.close()
    elif connected:
        from dualmem.evals.cluster import disconnect

        disconnect()


def resume_eval(
    run: str | Path,
    *,
    settings: dict[str, Any] | None = None,
    progress: bool = True,
    upload: bool | None = None,
    out: str | Path | None = None,
) -> Path:
    """Continue (or re-report) a run from its folder's ``run.json``, or from its record's URI alone (reports then go to
    ``out``, default its usual folder); ``settings`` may change operational ones (``concurrency``, ``ray_address``…),
    and those this process's environment sets win over the recorded ones (the endpoint may have moved)."""
    text = str(run)
    if "://" in text:
        recorded = RunRecord(text, Settings.resolve(settings).store_options).read_spec()
        if recorded is None:
            raise ConfigurationError(
                f"{text} holds no run record: pass the record URI a `dualmem eval` printed, or a run folder"
            )
        spec = RunSpec(**recorded["spec"])
        run_dir = Path(out) if out else spec.default_dir()
    else:
        spec, run_dir, recorded = spec_of(run), Path(run), read_run(run) or {}
    changed = sorted(k for k in (settings or {}) if k not in OPERATIONAL)
    if changed:
        raise ConfigurationError(
            f"--resume keeps the run's settings; {', '.join(changed)} would change its results "
            "(start another run instead)"
        )
    resolved = settings_of(spec, **{**operational_here(), **(settings or {})})
    if (
        spec.writer is None and implied_writer(resolved) is not None
    ):  # begun when the chat model wrote: it goes on writing
        resolved = resolved.replace(writer_model=resolved.chat_model)
    return run_eval(
        spec.dataset_kind,
        spec.path,
        spec.framework,
        judge=spec.judge_model,
        limit=spec.limit,
        out=run_dir,
        settings=resolved,
        model=None,
        respond=spec.respond,
        personas=spec.personas or None,
        progress=progress,
        upload=upload,
        calibrate_judge=bool(recorded.get("calibrate_judge")),
    )


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


calibrate_judge = calibrate_run.calibrate_judge  # the Python API of `dualmem eval calibrate-judge`, beside run_eval
