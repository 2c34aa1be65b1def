"""Run commands: the offline demo, the framework list, evaluations and the data generators."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.table import Table

from dualmem.cli.common import (
    DATASETS,
    EXIT_FAILED,
    ModelOpt,
    StoreOpt,
    _eval_settings,
    _preflight,
    _set_options,
    _settings,
    app,
    console,
    friendly,
    generate_app,
)
from dualmem.errors import ConfigurationError


@app.command()
@friendly
def demo(
    store: str | None = typer.Option(None, "--store", help="where to write (default .dualmem/demo)"),
    model: str | None = ModelOpt,
    realmem_sessions: int = typer.Option(
        0,
        "--realmem-sessions",
        help="also ingest the first N sessions of RealMem's Sophie_Dubois (when ../shared/data exists)",
    ),
) -> None:
    """Run the whole pipeline offline on the bundled sample with the bundled tiny model."""
    from dualmem.cli.demo import run_demo
    from dualmem.preflight import check_models, check_store_uri

    check_store_uri(store or ".dualmem/demo")
    check_models(_settings(model), ("chat",))
    run_demo(store=store or ".dualmem/demo", model=model, realmem_sessions=realmem_sessions, console=console)


@app.command()
def frameworks() -> None:
    """List the memory frameworks selectable with --framework."""
    from rich.markup import escape

    from dualmem.frameworks import REGISTRY, framework_class

    table = Table(title="memory frameworks")
    table.add_column("name")
    table.add_column("what it is")
    for name in REGISTRY:
        try:
            desc = framework_class(name).description
        except Exception as exc:  # noqa: BLE001 - show broken entries instead of hiding them
            desc = f"[red]unavailable: {escape(str(exc))}[/]"
        table.add_row(name, desc)
    console.print(table)


@app.command(name="eval", context_settings={"allow_interspersed_args": True})
@friendly
def eval_(
    args: list[str] = typer.Argument(
        None, help="PATH of the dataset, `compare RUN_DIR...`, `personality SOURCE` or `calibrate-judge PATH`"
    ),
    dataset: str = typer.Option(
        "auto", "--dataset", "-d", help=f"format: {', '.join(DATASETS)} (auto: detected from the file)"
    ),
    framework: str | None = typer.Option(
        None,
        "--framework",
        "-f",
        help="memory framework (see `dualmem frameworks`); several, comma-separated, run together",
    ),
    judge: str | None = typer.Option(
        None,
        "--judge",
        help="judge model provider:model (default: settings.evaluation.judge_model; none: no LLM judges)",
    ),
    limit: int | None = typer.Option(None, "--limit", help="evaluate only the first N queries of each history"),
    out: Path | None = typer.Option(
        None, "--out", help="run directory (default runs/<dataset>-<framework>-<fingerprint>: re-running continues it)"
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="continue the run in this folder (its run.json holds the command), or at its record URI"
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        help="run the units on a Ray cluster: auto, local, HOST:PORT or ray://HOST:10001 (setting ray_address)",
    ),
    set_: list[str] | None = typer.Option(
        None, "--set", help="override a setting for this run, NAME=VALUE (repeatable; see the README table)"
    ),
    upload: bool | None = typer.Option(
        None, "--upload/--no-upload", help="LangSmith experiment (default: upload when LANGSMITH_API_KEY is set)"
    ),
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    no_respond: bool = typer.Option(False, "--no-respond", help="retrieval metrics only, no in-character answers"),
    questionnaires: str = typer.Option("bfi,mbti", "--questionnaires", help="personality: bfi, mbti or both"),
    labels: Path | None = typer.Option(
        None, "--labels", help="personality: labels file {persona: {BFI: {dim: {score, type}}}}"
    ),
    sessions: int | None = typer.Option(
        None, "--sessions", help="personality: ingest only the first N sessions of each history"
    ),
    personas: str | None = typer.Option(None, "--personas", help="only these persona ids, comma-separated"),
    calibrate_judge: bool = typer.Option(
        False,
        "--calibrate-judge",
        help="first measure the judge's false-accept and false-reject rates on perturbed gold answers; "
        "reports show them beside every judged score",
    ),
) -> None:
    """Evaluate a framework (`dualmem eval -d realmem FILE -f NAME`), resume one (`--resume RUN`), compare runs, calibrate
    the judge (`calibrate-judge FILE`), or test personality."""
    from dualmem.preflight import require_extra

    require_extra("eval", "dualmem eval")  # the reports' plots; one line before anything loads
    os.environ.setdefault(
        "TQDM_DISABLE", "1"
    )  # progress is drawn by dualmem's own bars (langsmith and frameworks use tqdm)
    args = list(args or [])
    overrides = _set_options(set_)
    if ray is not None:
        overrides["ray_address"] = ray
    if judge is not None and judge.lower() == "none":  # no LLM judges, whatever the settings name
        judge, overrides["judge_model"] = None, ""
    chosen = [p.strip() for p in personas.split(",") if p.strip()] if personas else None
    if args and args[0] == "compare":
        from dualmem.evaluate import compare

        if len(args) < 2:
            raise ConfigurationError("`dualmem eval compare` needs one or more run directories")
        compare([Path(a) for a in args[1:]], out=out)
        return
    if args and args[0] == "calibrate-judge":
        _calibrate(args, dataset, judge, model, store, framework, overrides, chosen, out)
        return
    if args and args[0] == "personality":
        from dualmem.evals.personality_run import run_personality

        if len(args) != 2:
            raise ConfigurationError(
                "`dualmem eval personality SOURCE`: SOURCE is a dataset (with -d), a run folder, or ../shared/data/incharacter"
            )
        settings = _eval_settings(model, store, framework, judge, overrides)
        run_dir = run_personality(
            Path(args[1]),
            dataset_kind=dataset,
            framework=settings.evaluation.framework,
            settings=settings,
            questionnaires=questionnaires,
            labels=labels,
            sessions=sessions,
            personas=chosen,
            out=out,
        )
        console.print(f"personality report: [bold]{run_dir}[/]")
        return
    from dualmem.evaluate import resume_eval, run_evals

    if resume is not None:
        if args:
            raise ConfigurationError("--resume RUN takes no dataset PATH: the run folder's run.json holds it")
        run_dirs = [
            resume_eval(resume if "://" in resume else Path(resume), settings=overrides, upload=upload, out=out)
        ]
    else:
        if len(args) != 1:
            raise ConfigurationError(
                "`dualmem eval` needs one dataset PATH (or `--resume RUN`, `compare RUN...`, `personality SOURCE`)"
            )
        if dataset not in DATASETS:
            raise ConfigurationError(f"--dataset {dataset!r}: use one of {', '.join(DATASETS)}")
        settings = _eval_settings(model, store, framework, judge, overrides)
        if store:
            _preflight(settings)
        from dualmem.frameworks import framework_class
        from dualmem.preflight import check_models

        names = [n.strip() for n in settings.evaluation.framework.split(",") if n.strip()]
        writer = ("writer",) if any(framework_class(n).uses_writer for n in names) else ()
        if settings.ray_address:  # a bad or unreachable address is one line, before the models are checked
            from dualmem.evals.cluster import check_address

            check_address(settings.ray_address)
        check_models(
            settings.replace(framework=names[0]),
            ("chat", *writer) + (("judge",) if settings.evaluation.judge_model else ()),
        )
        run_dirs = run_evals(
            dataset,
            Path(args[0]),
            names,
            judge=judge or settings.evaluation.judge_model or None,
            limit=limit,
            out=out,
            settings=settings.replace(framework=names[0]),
            respond=not no_respond,
            personas=chosen,
            upload=upload,
            calibrate_judge=calibrate_judge,
        )
    failed = False
    for run_dir in run_dirs:
        console.print(f"report: [bold]{run_dir}[/]")
        failed = _eval_failures(run_dir) or failed
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _calibrate(
    args: list[str],
    dataset: str,
    judge: str | None,
    model: str | None,
    store: str | None,
    framework: str | None,
    overrides: dict[str, object],
    personas: list[str] | None,
    out: Path | None,
) -> None:
    """`dualmem eval calibrate-judge PATH`: the judge's leniency on the dataset's perturbed gold answers."""
    from dualmem.evals.calibration import leniency, warnings
    from dualmem.evaluate import calibrate_judge
    from dualmem.preflight import check_models

    if len(args) != 2:
        raise ConfigurationError(
            "`dualmem eval calibrate-judge PATH`: PATH is a dataset file or folder (with -d, or detected)"
        )
    if dataset not in DATASETS:
        raise ConfigurationError(f"--dataset {dataset!r}: use one of {', '.join(DATASETS)}")
    settings = _eval_settings(model, store, framework, judge, overrides)
    check_models(settings, ("judge",))
    folder = calibrate_judge(
        dataset, Path(args[1]), judge or settings.judge, settings=settings, personas=personas, out=out
    )
    result = json.loads((folder / "calibration.json").read_text(encoding="utf-8"))
    judged = sum(result["candidates"].values())
    table = Table(title=f"judge {result['judge_model']}: {result['queries']} gold answers, {judged} answers judged")
    for column in ("judge", "false-accept (wrong)", "false-reject (faithful)", "errors"):
        table.add_column(column, justify="left" if column == "judge" else "right")
    for key, row in result["judges"].items():
        table.add_row(key, *leniency(result, key), str(row["errors"]))
    console.print(table)
    for line in warnings(result):
        console.print(f"[bold red]{line}[/]", soft_wrap=True)
    console.print(f"calibration: [bold]{folder}[/] (calibration.json, .md, .html)", soft_wrap=True)


def _eval_failures(run_dir: Path) -> bool:
    """Say how many chunks, sessions and queries failed in a run; return whether any did."""
    import json

    path = run_dir / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    ingest = summary.get("ingest") or {}
    chunks, sessions = int(ingest.get("failed_chunks") or 0), len(ingest.get("failed_sessions") or [])
    queries = int(summary.get("n_query_errors") or 0)
    console.print(
        f"{chunks} failed chunk(s), {sessions} failed session(s), {queries} quer(y/ies) with errors (see the report)",
        soft_wrap=True,
    )
    return bool(chunks or sessions or queries)


@generate_app.command("rolememo")
@friendly
def generate_rolememo(
    personas: Path = typer.Option(..., "--personas", exists=True, help="folder of persona .json files"),
    out: Path = typer.Option(..., "--out", help="output folder"),
    lengths: str = typer.Option("32k,64k,128k,256k", "--lengths", help="history lengths in tokens, e.g. 32k,128k"),
    per_type: int = typer.Option(5, "--per-type", help="insights generated per task type (4 types)"),
    rounds: int = typer.Option(24, "--rounds", help="rounds of each woven dialogue"),
    model: str | None = ModelOpt,
    thread: str | None = typer.Option(None, "--thread", help="checkpoint thread (re-run to resume)"),
) -> None:
    """Generate a RoleMemo-style dataset: insights, fragments, woven dialogues, checks, long histories."""
    from dualmem.generate import generate_rolememo as run
    from dualmem.preflight import check_models

    try:
        sizes = tuple(
            int(float(x.lower().rstrip("k")) * (1000 if x.lower().endswith("k") else 1)) for x in lengths.split(",")
        )
    except ValueError:
        raise ConfigurationError(f"--lengths {lengths!r}: give token counts like 32k,64k,128k") from None
    settings = _settings(model)
    check_models(settings, ("chat", "judge"))
    os.environ.setdefault("TQDM_DISABLE", "1")  # the embedder's loading bars would break the progress display
    folder = run(
        personas,
        out,
        lengths=sizes,
        settings=settings,
        thread_id=thread,
        options={"n_per_type": per_type, "rounds": rounds},
    )
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    if not manifest.get("files"):
        raise typer.Exit(EXIT_FAILED)  # nothing kept: the rejections by check and kind were printed


@generate_app.command("realmem")
@friendly
def generate_realmem(
    persona: Path = typer.Option(..., "--persona", exists=True, help="persona .json file"),
    out: Path = typer.Option(..., "--out", help="output folder"),
    sessions: int = typer.Option(10, "--sessions", help="number of sessions"),
    framework: str = typer.Option("raw-turns", "--framework", "-f", help="memory framework of the assistant agent"),
    model: str | None = ModelOpt,
    thread: str | None = typer.Option(None, "--thread", help="checkpoint thread (re-run to resume)"),
) -> None:
    """Simulate a RealMem-style multi-session history with a user agent, assistant and memory manager."""
    from dualmem.generate import generate_realmem as run
    from dualmem.preflight import check_models

    settings = _settings(model)
    check_models(settings, ("chat", "judge"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    target = run(persona, out, sessions=sessions, settings=settings, framework=framework, thread_id=thread)
    if not json.loads(target.read_text(encoding="utf-8")).get("dialogues"):
        raise typer.Exit(EXIT_FAILED)  # no session simulated: the issues were printed
