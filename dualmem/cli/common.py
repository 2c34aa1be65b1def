"""What every `dualmem` command shares: the Typer apps, consoles, options, exit codes, errors, settings and preflight, memory tables."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dualmem.config import Settings
from dualmem.errors import ConfigurationError, DatasetError, ModelCallError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(
    help="DualMem: long-term memory for role-playing agents, written through their persona (facts + insights).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
generate_app = typer.Typer(
    help="Generate benchmark data (RoleMemo-style weaving, RealMem-style simulation).", no_args_is_help=True
)
app.add_typer(generate_app, name="generate")
console = Console()
err_console = Console(stderr=True)

DATASETS = ("auto", "rolememo", "realmem", "locomo")
ModelOpt = typer.Option(
    None, "--model", "-m", help="chat model as provider:model (default: settings.chat_model, local:smollm2)"
)
StoreOpt = typer.Option(None, "--store", help="LanceDB directory or URI (default: settings.store_uri)")
PersonaOpt = typer.Option(..., "--persona", "-p", help="persona id (as ingested) or a persona .json file")
UserOpt = typer.Option(
    None, "--user", "-u", help="whose memory: the user id (default: the persona's only user with memory)"
)

EXIT_FAILED = 1  # the run finished, but some chunks, sessions or queries failed (they are listed)
EXIT_MISCONFIGURED = 2  # a setting, a path or a data file is wrong: nothing was done
LEASE_WAIT_SHOWN_S = 0.05  # an ingest report shows a wait for another writer of the namespace from this long


def _error(message: Any) -> None:
    from dualmem.redact import scrub

    err_console.print(f"[bold red]error:[/] {escape(scrub(str(message)))}", highlight=False, soft_wrap=True)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn configuration and data errors into one red line and exit code 2 (a model that kept failing: 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ConfigurationError, DatasetError) as exc:
            _error(exc)
            raise typer.Exit(EXIT_MISCONFIGURED) from None
        except ModelCallError as exc:
            _error(f"{exc}; try again later, or raise call_retries / retry_max_wait")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper


def _settings(model: str | None = None, store: str | None = None, **extra: Any) -> Settings:
    return Settings.resolve(None, chat_model=model, store_uri=store, **extra)


def _preflight(
    settings: Settings, roles: tuple[str, ...] = (), *, checkpoints: bool = False, reads: bool = False
) -> None:
    """Check the store, the embedder's spec and each model before any work: nothing slow is loaded, remote models get
    one cheap call. ``reads``: the command only reads memory, so a missing store is an error and nothing is created."""
    from dualmem.preflight import check_embedder, check_file_path, check_models, check_store_uri

    check_embedder(settings)
    check_models(settings, roles)
    if reads:
        existing_store(settings)
    else:
        check_store_uri(settings.store_uri)
    if checkpoints:
        check_file_path(settings.checkpoint_path)


def existing_store(settings: Settings) -> list[tuple[str, ...]]:
    """Return the namespaces of the store the settings name, or raise (one line) when there is none to read."""
    from dualmem.stores.lance import stored_namespaces

    found = stored_namespaces(settings.store_uri, settings.store_options)
    if found is None:
        raise ConfigurationError(
            f"no memory at {settings.store_uri}: write some first (dualmem ingest FILE), or point --store "
            "(DUALMEM_STORE_URI) at the folder `dualmem ingest` wrote"
        )
    return found


def memory_user(settings: Settings, persona_id: str, user: str | None) -> str:
    """Return whose memory of ``persona_id`` a command reads: ``--user``, else the ``user_id`` setting, else the only user.

    Several users and no ``--user`` is a one-line error listing them; a (persona, user) without memory is said on
    stderr with the users that have some.
    """
    from dualmem.auth import whose_memory

    users = sorted({ns[1] for ns in existing_store(settings) if len(ns) == 2 and ns[0] == persona_id})
    chosen = whose_memory(claimed=[user], settings=settings, users=users, persona_id=persona_id)
    if chosen not in users:
        others = (
            f"users with memory: {', '.join(users)} (pass --user)"
            if users
            else "no user has memory of it yet (dualmem ingest)"
        )
        err_console.print(
            f"[yellow]note:[/] no memory of persona {escape(persona_id)} for user {escape(chosen)}; {escape(others)}",
            highlight=False,
            soft_wrap=True,
        )
    return chosen


def persona_file(ref: str) -> Any:
    """Return the persona of ``ref`` when it names a .json file (a broken one is a one-line error naming it), else None."""
    from pathlib import Path

    if Path(ref).suffix != ".json" or not Path(ref).is_file():
        return None
    from dualmem.stores.personas import load_persona_file

    return load_persona_file(ref)


def existing_file(path: Any) -> Any:
    """Return ``path`` if it exists, else raise a one-line error naming it."""
    from pathlib import Path

    if not Path(path).exists():
        raise ConfigurationError(f"{path}: no such file or folder (check the path)")
    return path


def _print_memory(reply: Any) -> None:
    facts = Table(title="retrieved facts", show_lines=False)
    for col in ("score", "fact", "session", "turns"):
        facts.add_column(col)
    for hit in reply.facts:
        facts.add_row(
            f"{hit.score:.3f}", hit.item.text, hit.item.source.session_id or "", ",".join(hit.item.source.turn_ids)
        )
    console.print(facts)
    insights = Table(title="retrieved insights (with the facts they cite)")
    for col in ("score", "insight", "grounding"):
        insights.add_column(col)
    for hit in reply.insights:
        cited = reply.grounding.get(hit.item.id, [])
        insights.add_row(
            f"{hit.score:.3f}", hit.item.text, "\n".join(f"- {f.text}" for f in cited) or "(cited facts missing)"
        )
    console.print(insights)


def _print_wait(report: Any) -> None:
    """Print how long the writer waited for another writer of the namespace (when it is worth a line)."""
    if report.lease_wait_s >= LEASE_WAIT_SHOWN_S:
        console.print(f"  waited {report.lease_wait_s:.1f} s for another writer of this namespace", highlight=False)


def _print_report(report: Any, persona_id: str) -> None:
    failed = report.failed_chunks
    flagged = report.flagged_turns
    console.print(
        f"[green]{persona_id}[/]: {len(report.chunks)} chunks, {report.facts_written} facts, {report.insights_written} insights, "
        f"{len(failed)} failed chunk(s), {len(flagged)} turn(s) flagged as requests to change the persona's memory "
        f"({report.request_facts} kept as request facts, {report.guard_rejected} operation(s) rejected by the guard)",
        soft_wrap=True,
    )
    for chunk in failed:
        console.print(
            f"  [yellow]failed[/] chunk {chunk['index']} ({chunk['chunk_id']}): {escape(str(chunk.get('error')))}",
            highlight=False,
            soft_wrap=True,
        )
    for flag in flagged[:20]:
        console.print(
            f"  [magenta]flagged[/] {escape(flag['turn_id'])} ({flag['kind']}): {escape(flag['text'][:100])}",
            highlight=False,
            soft_wrap=True,
        )
    if len(flagged) > 20:
        console.print(f"  … and {len(flagged) - 20} more flagged turn(s)")


def _set_options(pairs: list[str] | None) -> dict[str, Any]:
    """Turn ``--set name=value`` pairs into settings overrides (typed by the field's default)."""
    from dualmem.config import ENV_PREFIX, setting_kind

    kinds = {name: setting_kind(name) for name in Settings.field_names()}
    out: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, raw = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in kinds:
            raise ConfigurationError(
                f"--set {pair!r}: use NAME=VALUE with a setting of the README table "
                f"(e.g. --set retrieval_mode=merged); known: {', '.join(kinds)}"
            )
        kind = kinds[name]
        try:
            out[name] = (raw.strip().lower() in {"1", "true", "yes", "on"}) if kind is bool else kind(raw)
        except ValueError:
            raise ConfigurationError(
                f"--set {pair!r}: {raw!r} is not a valid {kind.__name__} ({ENV_PREFIX}{name.upper()})"
            ) from None
    return out


def _eval_settings(
    model: str | None, store: str | None, framework: str | None, judge: str | None, overrides: dict[str, Any]
) -> Settings:
    """Return the run's settings: explicit flags over ``--set`` over environment over defaults."""
    explicit = {"chat_model": model, "store_uri": store, "framework": framework, "judge_model": judge}
    return Settings.resolve(None, **{**overrides, **{k: v for k, v in explicit.items() if v is not None}})
