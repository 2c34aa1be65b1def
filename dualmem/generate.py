"""Dataset generators as plain functions (the ``dualmem generate`` CLI calls these).

:func:`generate_rolememo` runs the ``weave`` graph over a folder of persona
files and writes a RoleMemo dataset plus ``manifest.json``;
:func:`generate_realmem` runs the ``simulate`` graph for one persona and
writes a RealMem file. Both checkpoint to SQLite (``settings.checkpoint_path``)
under a thread id: re-running the same thread resumes, regenerating nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dualmem.config import Settings
from dualmem.context import Context, context_of
from dualmem.datasets._validate import json_files, write_json_atomic
from dualmem.datasets.personas import read_persona
from dualmem.errors import ConfigurationError
from dualmem.resume import run_resumable
from dualmem.schema import stable_id

console = Console(stderr=True)


def _context(settings: Settings, model: Any, judge_model: Any, embeddings: Any) -> Context:
    """Return the generators' context: the settings plus the given model, judge and embedder objects."""
    from dualmem.models import load_chat_model

    models = {}
    if model is not None:
        models["chat"] = load_chat_model(model, settings)
    if judge_model is not None:
        models["judge"] = load_chat_model(judge_model, settings, role="judge")
    return context_of(settings, models=models or None, embeddings=embeddings)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def run_graph(
    builder: Any,
    inputs: dict[str, Any],
    *,
    context: Context,
    thread_id: str,
    on_update: Any = None,
    on_resume: Any = None,
    recursion_limit: int = 100,
) -> dict[str, Any]:
    """Run (or resume) a graph on ``thread_id`` under the SQLite checkpointer; return its final values.

    ``on_update(update)`` sees every node update; ``on_resume(values)`` the saved
    values when an interrupted run is resumed. A thread that finished before is
    returned as it is; one started with other options is refused.
    """
    config = {
        "configurable": {"thread_id": thread_id},
        "max_concurrency": context.settings.evaluation.concurrency,
        "recursion_limit": recursion_limit,
    }
    resumed = False

    def check(snapshot: Any) -> dict[str, Any] | None:
        nonlocal resumed
        saved = (snapshot.values or {}).get("options")
        if saved is not None and saved != inputs.get("options"):
            raise ConfigurationError(
                f"thread {thread_id!r} was started with other options ({saved}); "
                "re-run with the same options to resume it, or pass a new thread id"
            )
        if snapshot.next:
            resumed = True
            if on_resume is not None:
                on_resume(dict(snapshot.values))
            return None
        return dict(snapshot.values) if snapshot.values else None  # finished before: nothing to do

    def batches() -> Iterator[dict[str, Any]]:
        if not resumed:  # an interrupted thread is finished, not started again
            yield inputs

    path = context.settings.checkpoint_path if context.settings.checkpoint_path != ":memory:" else None
    return run_resumable(builder, batches(), config, context=context, path=path, on_update=on_update, check=check)


def length_folder(tokens: int) -> str:
    """Return the sub-folder name of a history length (``32k``; a loadable RoleMemo dataset)."""
    return f"{tokens // 1000}k" if tokens % 1000 == 0 else str(tokens)


def print_pass_rates(manifest: dict[str, Any], title: str) -> None:
    """Print the pass rate of every check as a table."""
    table = Table(title=title)
    for col in ("check", "passed", "total", "rate", "top rejection"):
        table.add_column(col)
    for name, row in manifest.get("checks", {}).items():
        top = max(row["rejections"].items(), key=lambda kv: kv[1], default=("", 0))
        table.add_row(
            name,
            str(row["passed"]),
            str(row["total"]),
            f"{row['pass_rate']:.0%}",
            f"{top[0]} ({top[1]})" if top[1] else "",
        )
    console.print(table)


def generate_rolememo(
    personas_dir: str | Path,
    out_dir: str | Path,
    *,
    lengths: Sequence[int] = (32000, 64000, 128000, 256000),
    model: Any = None,
    settings: Settings | dict[str, Any] | None = None,
    thread_id: str | None = None,
    judge_model: Any = None,
    embeddings: Any = None,
    options: dict[str, Any] | None = None,
) -> Path:
    """Generate a RoleMemo dataset from a folder (or file) of personas into ``out_dir``; return ``out_dir``.

    Layout: ``out_dir/<length>/<persona>-<length>.json`` (each length folder is
    a dataset ``load_dataset("rolememo", ...)`` reads) and ``out_dir/manifest.json``.

    ``options`` sets :class:`~dualmem.generators.weave.WeaveOptions` fields
    (``n_per_type``, ``rounds``, thresholds, ``seed``, ``depths``…).
    """
    from dualmem.generators.weave import WeaveOptions
    from dualmem.graphs.weave import builder

    settings = Settings.resolve(settings)
    personas = [read_persona(f) for f in json_files(personas_dir)]
    ids = [p.id for p in personas]
    if len(set(ids)) != len(ids):
        raise ConfigurationError(f'persona ids must be unique, got {ids}; set distinct "id" keys in the persona files')
    opts = WeaveOptions.of({**(options or {}), "lengths": tuple(int(n) for n in lengths)})
    res = _context(settings, model, judge_model, embeddings)
    thread = thread_id or stable_id("weave", *ids, json.dumps(opts.as_dict(), sort_keys=True), prefix="weave-")
    inputs = {"personas": [p.model_dump(mode="json", exclude_none=True) for p in personas], "options": opts.as_dict()}
    with _progress() as bar:
        t_personas = bar.add_task("ideating insights (personas)", total=len(personas))
        t_queries = bar.add_task("building queries (insights)", total=None)

        def on_update(update: dict[str, Any]) -> None:
            for node, value in update.items():
                if node == "ideate":
                    bar.advance(t_personas)
                    made = sum(r.get("insights", 0) for r in (value or {}).get("ideated", []))
                    total = bar.tasks[t_queries].total or 0
                    bar.update(t_queries, total=total + made)
                elif node == "make_query":
                    bar.advance(t_queries)

        def on_resume(saved: dict[str, Any]) -> None:
            bar.update(t_personas, completed=len(saved.get("ideated") or []))
            bar.update(t_queries, total=len(saved.get("insights") or []), completed=len(saved.get("results") or []))
            console.print(
                f"resuming thread {thread}: {len(saved.get('results') or [])} insight branch(es) already done"
            )

        values = run_graph(builder, inputs, context=res, thread_id=thread, on_update=on_update, on_resume=on_resume)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from dualmem.datasets.rolememo import parse_rolememo

    files: list[str] = []
    for data in values.get("items") or []:
        target = out / length_folder(data["meta"]["assembly"]["target_tokens"]) / f"{data['id']}.json"
        parse_rolememo(data, target)  # never write what the loader cannot read back
        write_json_atomic(target, data)
        files.append(str(target.relative_to(out)))
    manifest = {**(values.get("manifest") or {}), "thread_id": thread, "files": files}
    write_json_atomic(out / "manifest.json", manifest)
    print_pass_rates(
        manifest,
        f"RoleMemo generation: {manifest.get('queries_kept', 0)} queries kept, {len(manifest['files'])} histories",
    )
    if not files:
        console.print(
            f"[yellow]no query passed every check, so no history was written; rejections by check and kind "
            f"(each one with its reason in {out / 'manifest.json'}):"
        )
        for line in rejection_breakdown(manifest):
            console.print(f"  {line}", soft_wrap=True)
    return out


def rejection_breakdown(manifest: dict[str, Any]) -> list[str]:
    """Return one line per check and rejection kind with its count (``ideation: needs >= N reasoning steps: 8``)."""
    lines = []
    for name, row in (manifest.get("checks") or {}).items():
        lines += [
            f"{name}: {kind}: {n}" for kind, n in sorted(row.get("rejections", {}).items(), key=lambda kv: -kv[1])
        ]
        if row.get("shortfall"):
            lines.append(f"{name}: shortfall: {row['shortfall']} of {row.get('asked')} insights asked for")
    return lines


def generate_realmem(
    persona_file: str | Path,
    out_dir: str | Path,
    *,
    sessions: int = 10,
    model: Any = None,
    settings: Settings | dict[str, Any] | None = None,
    thread_id: str | None = None,
    framework: Any = None,
    judge_model: Any = None,
    embeddings: Any = None,
    options: dict[str, Any] | None = None,
) -> Path:
    """Simulate a RealMem-style history for one persona; write ``<id>_dialogues_sim.json`` and return its path.

    ``framework``: a registered framework name (default ``raw-turns``) or a
    :class:`~dualmem.frameworks.base.MemoryFramework` instance the assistant
    retrieves earlier sessions from. ``options`` sets
    :class:`~dualmem.generators.simulate.SimulateOptions` fields.
    """
    from dualmem.datasets.realmem import parse_realmem
    from dualmem.frameworks.base import MemoryFramework
    from dualmem.generators.simulate import SimulateOptions
    from dualmem.graphs.simulate import builder

    settings = Settings.resolve(settings)
    persona = read_persona(persona_file)
    opts_in = {**(options or {}), "sessions": sessions}
    if isinstance(framework, str):
        opts_in["framework"] = framework
    opts = SimulateOptions.of(opts_in)
    thread = thread_id or stable_id(
        "simulate", persona.id, json.dumps(opts.as_dict(), sort_keys=True), prefix="simulate-"
    )
    res = _context(settings, model, judge_model, embeddings).with_(
        user_id=thread,  # each simulation remembers in a namespace of its own: (persona, thread)
        memory=framework if isinstance(framework, MemoryFramework) else None,
    )
    inputs = {"persona": persona.model_dump(mode="json", exclude_none=True), "options": opts.as_dict()}
    with _progress() as bar:
        task = bar.add_task(f"simulating sessions ({persona.name})", total=sessions)

        def on_update(update: dict[str, Any]) -> None:
            if "close_session" in update:
                bar.advance(task)
            elif "events" in update:
                bar.update(task, total=len((update["events"] or {}).get("events") or []) or sessions)

        def on_resume(saved: dict[str, Any]) -> None:
            bar.update(
                task, total=len(saved.get("events") or []) or sessions, completed=len(saved.get("sessions") or [])
            )

        limit = 16 + sessions * (3 * opts.max_turns + 4)
        values = run_graph(
            builder,
            inputs,
            context=res,
            thread_id=thread,
            on_update=on_update,
            on_resume=on_resume,
            recursion_limit=limit,
        )
    data = values.get("realmem")
    if not data:
        raise ConfigurationError(f"simulation thread {thread} has no result; re-run with the same thread to resume it")
    target = Path(out_dir) / f"{re.sub(r'[^A-Za-z0-9_-]+', '_', persona.id)}_dialogues_sim.json"
    parse_realmem(data, target)  # never write what the loader cannot read back
    write_json_atomic(target, data)
    issues = data["_metadata"].get("issues") or []
    n_queries = sum(1 for s in data["dialogues"] for t in s["dialogue_turns"] if t.get("is_query"))
    n_points = sum(len(s["extracted_memory"]) for s in data["dialogues"])
    if not data["dialogues"]:
        console.print(
            f"[yellow]no session could be simulated; the issues are listed in {target} under _metadata.issues:"
        )
        for issue in issues[:10]:
            console.print(f"  {issue.get('stage')}: {issue.get('reason')}", soft_wrap=True)
    console.print(
        f"RealMem simulation: {len(data['dialogues'])} sessions, {n_queries} memory queries, {n_points} memory points, "
        f"{len(issues)} issue(s) recorded -> {target}"
    )
    return target
