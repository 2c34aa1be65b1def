"""Memory commands: ingest a history, ask and chat in character, flush chat turns, inspect and maintain the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from dualmem.cli.common import (
    DATASETS,
    EXIT_FAILED,
    ModelOpt,
    PersonaOpt,
    StoreOpt,
    UserOpt,
    _error,
    _preflight,
    _print_memory,
    _print_report,
    _print_wait,
    _settings,
    app,
    console,
    existing_file,
    friendly,
    memory_user,
    persona_file,
)
from dualmem.errors import ConfigurationError, ModelCallError


@app.command()
@friendly
def ingest(
    path: Path = typer.Argument(..., help="dataset file (or folder for rolememo)"),
    dataset: str = typer.Option(
        "auto", "--dataset", "-d", help=f"format: {', '.join(DATASETS)} (auto: detected from the file)"
    ),
    persona: Path | None = typer.Option(
        None, "--persona", "-p", help="persona .json to write through (else the dataset's)"
    ),
    sessions: int | None = typer.Option(None, "--sessions", help="ingest only the first N sessions"),
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    user: str | None = typer.Option(
        None, "--user", "-u", help="user id of every history (default: each dialogue's own user)"
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        help="write the histories on a Ray cluster: auto, local, HOST:PORT or ray://HOST:10001 (setting ray_address)",
    ),
) -> None:
    """Write facts and insights from dialogue histories into the store (resumable; several writers may run at once).

    The histories of a file or folder are written in parallel (up to the `concurrency` setting), or as tasks of a
    Ray cluster with `--ray`; each history's chunks are written in order, each exactly once."""
    from dualmem.datasets import load_dataset
    from dualmem.evals.cost import describe, price_table
    from dualmem.evals.ingest import ingest_histories, plan_histories
    from dualmem.stores.personas import load_persona_file

    if dataset not in DATASETS:
        raise ConfigurationError(f"--dataset {dataset!r}: use one of {', '.join(DATASETS)}")
    existing_file(path)
    settings = _settings(model, store, ray_address=ray)
    if settings.ray_address:  # a bad or unreachable address is one line, before anything loads
        from dualmem.evals.cluster import check_address

        check_address(settings.ray_address)
    who = load_persona_file(persona) if persona else None
    price_table(settings.evaluation.prices)  # a malformed price table is one line, before anything is written
    histories = plan_histories(
        load_dataset(dataset, path), settings, persona=who, sessions=sessions, user=user, source=path
    )
    _preflight(settings, ("writer", "chat") if settings.tuning.emotion_strategy else ("writer",), checkpoints=True)
    failed = 0

    def report(done: Any, history: Any) -> None:
        nonlocal failed
        label = history.label
        if done.chunks and all(r["status"] == "skipped" for r in done.chunks):
            console.print(f"[green]{label}[/]: all {len(done.chunks)} chunks were written before; nothing to do")
        else:
            _print_report(done, label)
            if done.cost:
                console.print(f"  cost: {escape(describe(done.cost))}", highlight=False, soft_wrap=True)
        _print_wait(done)
        failed += len(done.failed_chunks)
        console.print(
            f'ask: dualmem ask "..." --persona {history.namespace[0]} --user {history.namespace[1]}',
            soft_wrap=True,
            highlight=False,
        )

    ingest_histories(histories, settings, on_report=report)
    console.print(f"memory stored in [bold]{settings.store_uri}[/]", soft_wrap=True)
    if failed:
        _error(f"{failed} chunk(s) failed (listed above); run the same command again to retry only them")
        raise typer.Exit(EXIT_FAILED)


@app.command()
@friendly
def sample(
    path: Path = typer.Argument(Path("sample_dialogue.json"), help="where to write the bundled sample dialogue"),
) -> None:
    """Write the bundled sample (persona Mara Okafor, user theo, four sessions, three queries) to a file to try DualMem on."""
    import shutil

    from dualmem.datasets import sample_path

    if path.exists() and path.is_dir():
        path = path / "sample_dialogue.json"
    shutil.copyfile(sample_path(), path)
    console.print(f"wrote {path}: try `dualmem ingest {path}`", highlight=False, soft_wrap=True)


@app.command()
@friendly
def ask(
    question: str = typer.Argument(..., help="the user's message"),
    persona: str = PersonaOpt,
    k: int | None = typer.Option(
        None, "--k", help="facts and insights retrieved (default settings.tuning.retrieval_k)"
    ),
    mode: str | None = typer.Option(None, "--mode", help="dual or merged"),
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    show_memory: bool = typer.Option(True, "--show-memory/--no-show-memory", help="print retrieved memory"),
    user: str | None = UserOpt,
) -> None:
    """Answer one message in character from memory."""
    from dualmem.graphs.respond import respond
    from dualmem.stores.personas import find_persona

    settings = _settings(model, store, retrieval_k=k, retrieval_mode=mode)
    given = persona_file(persona)  # the user's own file is checked first: its error names it
    _preflight(settings, ("chat",), reads=True)
    who = given or find_persona(settings.store_uri, persona, settings.store_options)
    settings = settings.replace(user_id=memory_user(settings, who.id, user))
    reply = respond(question, who, settings=settings)
    if show_memory:
        _print_memory(reply)
    console.print(f"[bold]{escape(who.name)}:[/] {escape(reply.text)}", highlight=False)


@app.command()
@friendly
def chat(
    persona: str = PersonaOpt,
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    remember: bool = typer.Option(
        True, "--remember/--no-remember", help="form memory from the chat (in the background, a chunk at a time)"
    ),
    user: str | None = UserOpt,
) -> None:
    """Chat in character; memory is retrieved every turn and (by default) formed from the chat in the background."""
    import uuid

    from dualmem.chat import FormationExecutor
    from dualmem.graphs.respond import respond
    from dualmem.stores import langgraph_view, open_store
    from dualmem.stores.personas import find_persona

    settings = _settings(model, store)
    given = persona_file(persona)
    _preflight(settings, ("chat", "writer") if remember else ("chat",), reads=True)
    who = given or find_persona(settings.store_uri, persona, settings.store_options)
    settings = settings.replace(user_id=memory_user(settings, who.id, user))
    db = open_store(settings)
    formation = FormationExecutor() if remember else None
    if formation is not None:  # turns an earlier chat left pending (a crash, an exit before they were written)
        formation.recover(langgraph_view(db), settings, namespace=(who.id, settings.user_id))
    thread = f"cli-{uuid.uuid4().hex[:12]}"
    console.print(f"Chatting with [bold]{who.name}[/] (empty line or Ctrl-D to stop).")
    history: list[tuple[str, str]] = []
    unanswered = 0
    while True:
        try:
            message = console.input("[bold cyan]you>[/] ")
        except EOFError:
            break
        if not message.strip():
            break
        try:
            reply = respond(
                message,
                who,
                settings=settings,
                store=db,
                history=history,
                remember=remember,
                thread_id=thread,
                formation=formation,
            )
        except ModelCallError as exc:  # one failed message does not end the chat
            unanswered += 1
            _error(f"{exc}; your message was not answered (send it again)")
            continue
        history.append((message, reply.text))
        console.print(f"[bold]{escape(who.name)}>[/] {escape(reply.text)}", highlight=False)
        if reply.pending.get("flagged"):
            console.print(
                f"[magenta](memory guard)[/] your message asks to change {who.name}'s memory or beliefs; "
                "it is kept only as a request, never as their insight",
                highlight=False,
            )
    failed = _form_rest(formation) if formation is not None else 0
    if unanswered or failed:
        raise typer.Exit(EXIT_FAILED)


def _form_rest(formation: Any) -> int:
    """Write what the chat left pending now; print what was formed; return the failed chunks."""
    with console.status("forming memory from the chat…"):
        formed = formation.flush()
    formation.shutdown()
    return _print_formed(formed)


def _print_formed(formed: list[Any]) -> int:
    rows = [r for f in formed for r in f.rows]
    applied = [r for r in rows if r.get("status") == "applied"]
    facts = sum(
        1 for r in applied for op in r.get("applied") or [] if op["stream"] == "fact" and op["op"] in ("ADD", "UPDATE")
    )
    insights = sum(
        1
        for r in applied
        for op in r.get("applied") or []
        if op["stream"] == "insight" and op["op"] in ("ADD", "UPDATE")
    )
    failed = [r for r in rows if r.get("status") == "failed"]
    if rows:
        console.print(
            f"memory formed: {len(applied)} chunk(s), {facts} fact(s) and {insights} insight(s) written", soft_wrap=True
        )
    for row in failed:
        _error(
            f"chunk {row['chunk_id']} was not written (its turns stay pending; `dualmem flush` retries): {row.get('error')}"
        )
    for f in formed:
        if f.error:
            _error(f"thread {f.thread} was not written (its turns stay pending; `dualmem flush` retries): {f.error}")
    return len(failed) + sum(1 for f in formed if f.error)


@app.command()
@friendly
def flush(
    store: str | None = StoreOpt,
    model: str | None = ModelOpt,
    persona: str | None = typer.Option(
        None, "--persona", "-p", help="only this persona's chats (default: every persona)"
    ),
    user: str | None = typer.Option(None, "--user", "-u", help="only this user's chats (with --persona)"),
    now: bool = typer.Option(
        False, "--now", help="also write the last, unfinished chunk of chats that are not quiet yet"
    ),
) -> None:
    """Write chat turns left pending (after a crash, or an exit before they were written): full chunks, and quiet chats whole."""
    from dualmem.chat.formation import run_formation
    from dualmem.chat.pending import FormationRequest, PendingThread, pending_threads
    from dualmem.schema import check_id
    from dualmem.stores import LanceDBStore

    settings = _settings(model, store)
    for value, what in ((persona, "--persona"), (user, "--user")):
        if value is not None:
            try:
                check_id(value, what)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
    _preflight(settings, ("writer",))
    lg = LanceDBStore.from_settings(settings)
    prefix = (persona, user) if persona and user else (persona,) if persona else ()
    formed = []
    for namespace, thread in pending_threads(lg, prefix):
        snap = PendingThread(lg, namespace, thread).read()
        if not snap.turns:
            continue
        if not snap.persona:
            _error(f"thread {thread} of {namespace} has pending turns but no persona; skipped")
            continue
        result = run_formation(FormationRequest(snap.persona, namespace, thread, settings, store=lg), flush=now)
        console.print(
            f"{namespace[0]} / {namespace[1]} / {thread}: {len(result.rows)} chunk(s); {result.pending_turns} turn(s) still pending",
            soft_wrap=True,
        )
        formed.append(result)
    if _print_formed(formed):
        raise typer.Exit(EXIT_FAILED)
    if not formed:
        console.print("no chat turns pending")


@app.command()
@friendly
def inspect(
    persona: str = PersonaOpt,
    kind: str | None = typer.Option(None, "--kind", help="fact or insight (default both)"),
    search: str | None = typer.Option(None, "--search", "-s", help="hybrid search instead of listing"),
    limit: int = typer.Option(20, "--limit", help="rows to show"),
    store: str | None = StoreOpt,
    all_status: bool = typer.Option(False, "--all", help="include superseded items"),
    user: str | None = UserOpt,
    history: str | None = typer.Option(
        None, "--history", help="show this item's ADD / UPDATE / DELETE history instead"
    ),
) -> None:
    """List or search a persona's facts and insights (of one user), or one item's history (--history ID)."""
    from dualmem.stores import open_store
    from dualmem.stores.personas import find_persona

    if kind not in (None, "fact", "insight"):
        raise ConfigurationError(f"--kind {kind!r}: use fact or insight")
    settings = _settings(None, store)
    _preflight(settings, reads=True)
    who = find_persona(settings.store_uri, persona, settings.store_options)
    namespace = (who.id, memory_user(settings, who.id, user))
    db = open_store(settings)
    if history:
        from dualmem.cli.control import print_history

        return print_history(db, namespace, history)
    status = None if all_status else "active"
    if search:
        rows = [(h.item, f"{h.score:.3f}") for h in db.search(namespace, search, kind=kind, k=limit, status=status)]  # type: ignore[arg-type]
    else:
        rows = [(i, "") for i in db.list(namespace, kind=kind, status=status, limit=limit)]  # type: ignore[arg-type]
    table = Table(
        title=f"{who.name} / {namespace[1]}: {db.count(namespace, 'fact')} facts, "
        f"{db.count(namespace, 'insight')} insights in {settings.store_uri}"
    )
    for col in ("kind", "id", "text", "source", "grounding", "status", "score"):
        table.add_column(col)
    for item, score in rows:
        source = f"{item.source.session_id or ''} {','.join(item.source.turn_ids)}".strip()
        kind = (
            f"{item.kind} (request)" if item.meta.get("guard") else item.kind
        )  # what the user asked, not the persona's view
        table.add_row(kind, item.id, item.text, source, ",".join(item.grounding), item.status, score)
    console.print(table)


@app.command()
@friendly
def maintain(store: str | None = StoreOpt) -> None:
    """Maintain a shared store: delete expired store items, repair duplicate rows of one key left by older versions
    (keeping the latest), compact the tables, fold new rows into the indexes, drop old versions.

    Safe while servers and writers use the store (run it from cron, say): every reader sees the data before or after.
    """
    from dualmem.stores import LanceDBStore

    settings = _settings(None, store)
    lg = LanceDBStore.from_settings(settings)
    swept = lg.sweep_ttl()
    done = lg.maintain()
    console.print(
        f"{swept} expired store item(s) deleted; {done.get('duplicates_removed', 0)} duplicate row(s) removed; "
        f"tables compacted and indexed in {settings.store_uri}",
        soft_wrap=True,
    )
