"""Control commands: forget a user (or a persona's users, or an item), export and import a namespace, serve MCP;
and the history view of ``dualmem inspect --history ID``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from dualmem.cli.common import (
    EXIT_FAILED,
    StoreOpt,
    _error,
    _settings,
    app,
    console,
    existing_store,
    friendly,
    memory_user,
)
from dualmem.errors import ConfigurationError

ForgetPersonaOpt = typer.Option(..., "--persona", "-p", help="persona id whose memory to forget")


def _persona_id(ref: str) -> str:
    """Return a persona id: the id itself, or the ``id`` of a persona .json file."""
    path = Path(ref)
    if path.suffix == ".json" and path.is_file():
        from dualmem.stores.personas import load_persona_file

        return load_persona_file(path).id
    return ref


def _confirmed(question: str) -> bool:
    """Ask a yes/no question on the terminal; no answer (end of input) is no."""
    import click

    try:
        return bool(typer.confirm(question, default=False))
    except click.exceptions.Abort:
        return False


@app.command()
@friendly
def forget(
    persona: str = ForgetPersonaOpt,
    user: str | None = typer.Option(None, "--user", "-u", help="the user to forget"),
    all_users: bool = typer.Option(False, "--all-users", help="forget every user of the persona"),
    item: str | None = typer.Option(None, "--item", help="forget only this item (and its history) of --user"),
    thread: list[str] | None = typer.Option(
        None, "--thread", help="a chat thread of the user to delete from the checkpointer (repeatable)"
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation (scripts)"),
    wait: float = typer.Option(
        0.0, "--wait", help="seconds to wait for a writer holding the namespace (default: refuse at once)"
    ),
    checkpoints: str | None = typer.Option(
        None, "--checkpoints", help="SQLite checkpointer file (default settings.checkpoint_path)"
    ),
    unverified: bool = typer.Option(
        False,
        "--unverified",
        help="also delete files no table version references (only when no other process uses the store)",
    ),
    store: str | None = StoreOpt,
) -> None:
    """Forget a user's memory — facts, insights, history, ledger, pending chat turns, LangGraph store items, every
    framework's records, checkpoints — and the old LanceDB versions and index files that still hold them."""
    from dualmem.control.forget import carry_out, locate, plan_forget
    from dualmem.control.places import Target

    if all_users == (user is not None):
        raise ConfigurationError(
            "name the user with --user USER, or pass --all-users to forget every user of the persona"
        )
    if item is not None and user is None:
        raise ConfigurationError(f"--item {item!r} needs the user it belongs to: --user USER")
    settings = _settings(None, store, checkpoint_path=checkpoints)
    plan = plan_forget(Target(_persona_id(persona), user, item), locate(settings), thread or ())
    for line in plan.lines():
        console.print(escape(line), highlight=False, soft_wrap=True)
    if not yes and not _confirmed("Forget all of this? It cannot be undone"):
        _error("nothing was forgotten (pass --yes to forget without being asked)")
        raise typer.Exit(EXIT_FAILED)
    report = carry_out(plan, wait_s=wait, threads=thread or (), delete_unverified=unverified)
    for line in report.lines():
        console.print(escape(line), highlight=False, soft_wrap=True)


@app.command()
@friendly
def export(
    persona: str = typer.Option(..., "--persona", "-p", help="persona id of the memory to export"),
    user: str | None = typer.Option(
        None, "--user", "-u", help="user id (default: the persona's only user with memory)"
    ),
    out: Path = typer.Option(..., "--out", "-o", help="file to write: .json, or .jsonl for JSON Lines"),
    lines: bool | None = typer.Option(None, "--jsonl/--json", help="layout (default: by the file's suffix)"),
    store: str | None = StoreOpt,
) -> None:
    """Export one user's memory — every item with its provenance, grounding, vector and history — to a documented file."""
    from dualmem.control.export import export_namespace
    from dualmem.stores import open_store

    settings = _settings(None, store)
    who = _persona_id(persona)
    namespace = (who, memory_user(settings, who, user))  # the same user rule as every command that reads memory
    counts = export_namespace(open_store(settings), namespace, out, lines=lines)
    console.print(
        f"exported {counts['items']} item(s), {counts['versions']} version row(s), {counts['ledger']} ledger unit(s) "
        f"to {out}",
        soft_wrap=True,
    )


@app.command("import")
@friendly
def import_(
    path: Path = typer.Argument(..., help="a file `dualmem export` wrote"),
    persona: str | None = typer.Option(
        None, "--persona", "-p", help="import under this persona id (default: the export's)"
    ),
    user: str | None = typer.Option(None, "--user", "-u", help="import under this user id (default: the export's)"),
    merge: bool = typer.Option(False, "--merge", help="upsert over items the namespace already holds"),
    reembed: bool = typer.Option(
        False, "--reembed", help="embed the texts with this store's embedder instead of using the export's vectors"
    ),
    store: str | None = StoreOpt,
) -> None:
    """Import an export into a store (a folder or object storage): retrieval then ranks as it did where it was exported."""
    from dualmem.control.export import import_archive, read_export
    from dualmem.stores import open_store

    archive = read_export(path)  # the whole file is checked before anything is written
    ns = (persona or archive.namespace[0], user or archive.namespace[1])
    settings = _settings(None, store)
    counts = import_archive(archive, open_store(settings), namespace=ns, merge=merge, reembed=reembed)
    console.print(
        f"imported {counts['items']} item(s), {counts['versions']} version row(s), {counts['ledger']} ledger unit(s) "
        f"into {ns} at {settings.store_uri}",
        soft_wrap=True,
    )


@app.command()
@friendly
def mcp(
    persona: str | None = typer.Option(
        None, "--persona", "-p", help="scope every connection to this persona (else per connection or call)"
    ),
    user: str | None = typer.Option(
        None, "--user", "-u", help="scope every connection to this user (else per connection or call)"
    ),
    transport: str = typer.Option(
        "stdio", "--transport", help="stdio, or http (streamable HTTP at http://HOST:PORT/mcp)"
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="HTTP address to listen on (beyond loopback only with --tokens)"
    ),
    port: int = typer.Option(8000, "--port", help="HTTP port"),
    tokens: str | None = typer.Option(
        None, "--tokens", help="JSON file of bearer tokens -> identity (else DUALMEM_TOKENS); HTTP only"
    ),
    allowed_host: list[str] = typer.Option(
        [], "--allowed-host", help="another Host name clients use (DNS-rebinding protection), repeatable"
    ),
    store: str | None = StoreOpt,
) -> None:
    """Serve the memory as MCP tools (search facts and insights, add a fact, forget, history); see docs/mcp.md."""
    from dualmem.auth import check_exposure, load_tokens
    from dualmem.control.mcp import Scope, serve

    table = load_tokens(tokens) if transport == "http" else None
    if transport == "http":
        check_exposure(host, table, "--tokens FILE (or set DUALMEM_TOKENS)")  # before the store opens
    serve(
        _settings(None, store),
        scope=Scope(persona, user),
        transport=transport,
        host=host,
        port=port,
        tokens=table,
        allowed_hosts=tuple(allowed_host),
    )


@app.command()
@friendly
def migrate(
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would be done; change nothing"),
    backup: bool = typer.Option(True, "--backup/--no-backup", help="copy a local store folder beside itself first"),
    store: str | None = StoreOpt,
) -> None:
    """Move a store written by an earlier DualMem to the current storage format (docs/guides/stores.md)."""
    from dualmem.stores.migrate import migrate as run_migration

    settings = _settings(None, store)
    existing_store(settings)
    report = run_migration(settings.store_uri, settings.store_options, dry_run=dry_run, backup=backup)
    for line in report.lines():
        console.print(escape(line), highlight=False, soft_wrap=True)


@app.command()
@friendly
def ui(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (beyond loopback only with --tokens)"),
    port: int = typer.Option(8700, "--port", help="port of http://HOST:PORT/"),
    tokens: str | None = typer.Option(
        None, "--tokens", help="JSON file of tokens -> identity (else DUALMEM_TOKENS): each sees only their own memory"
    ),
    allowed_host: list[str] = typer.Option(
        [], "--allowed-host", help="another Host name browsers use (DNS-rebinding protection), repeatable"
    ),
    store: str | None = StoreOpt,
) -> None:
    """Browse what each persona remembers in a web page: facts, insights, their sources and history, search, export and
    forget (docs/guides/browser.md)."""
    from dualmem.auth import check_exposure, load_tokens

    table = load_tokens(tokens)
    check_exposure(host, table, "--tokens FILE (or set DUALMEM_TOKENS)")  # before anything loads
    from dualmem.ui.app import serve

    settings = _settings(None, store)
    existing_store(settings)
    console.print(f"memory browser on http://{host if ':' not in host else f'[{host}]'}:{port}/ (Ctrl-C to stop)")
    serve(settings, host=host, port=port, tokens=table, allowed_hosts=tuple(allowed_host))


def print_history(db: Any, namespace: tuple[str, str], item_id: str, as_json: bool = False) -> None:
    """Print an item's history (``dualmem inspect --history ID``): each ADD / UPDATE / DELETE, oldest first."""
    from dualmem.control.history import item_history

    records = item_history(db, namespace, item_id)
    if as_json:
        console.print_json(json.dumps(records, default=str))
        return
    console.print(f"history of {escape(item_id)} in {escape(str(namespace))}, oldest first:", highlight=False)
    for r in records:
        text = r["text_after"] if r["op"] == "ADD" else f"{r['text_before']!r} -> {r['text_after']!r}"
        change = r["chunk_id"] or r["change"] or ""
        console.print(
            f"{r['op']:<6} {r['at']}  {r['via']} {escape(change)}  {escape(str(text))}", highlight=False, soft_wrap=True
        )
