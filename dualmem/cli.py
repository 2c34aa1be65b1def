"""The `dualmem` command: ingest, ask, chat, inspect, demo, frameworks, eval, generate, train."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
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
generate_app = typer.Typer(help="Generate benchmark data (RoleMemo-style weaving, RealMem-style simulation).", no_args_is_help=True)
app.add_typer(generate_app, name="generate")
console = Console()
err_console = Console(stderr=True)

DATASETS = ("rolememo", "realmem", "locomo")
ModelOpt = typer.Option(None, "--model", "-m", help="chat model as provider:model (default: settings.chat_model, local:smollm2)")
StoreOpt = typer.Option(None, "--store", help="LanceDB directory or URI (default: settings.store_uri)")
PersonaOpt = typer.Option(..., "--persona", "-p", help="persona id (as ingested) or a persona .json file")
UserOpt = typer.Option(None, "--user", "-u", help="user id: the second part of the memory namespace (default settings.user_id)")


def _mount_train() -> None:
    try:
        from dualmem.training.cli import train_app
    except ImportError:  # training extras not installed
        return
    app.add_typer(train_app, name="train", help="Train the writer model: SFT export, SFT, GRPO (TRL / VeRL).")


EXIT_FAILED = 1  # the run finished, but some chunks, sessions or queries failed (they are listed)
EXIT_MISCONFIGURED = 2  # a setting, a path or a data file is wrong: nothing was done


def _error(message: Any) -> None:
    err_console.print(f"[bold red]error:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


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


def _preflight(settings: Settings, roles: tuple[str, ...] = (), *, checkpoints: bool = False) -> None:
    """Check the store (and the checkpoint file) and make one cheap call to each remote model, before any work."""
    from dualmem.preflight import check_file_path, check_models, check_store_uri

    check_store_uri(settings.store_uri)
    if checkpoints:
        check_file_path(settings.checkpoint_path)
    check_models(settings, roles)


def _print_memory(reply: Any) -> None:
    facts = Table(title="retrieved facts", show_lines=False)
    for col in ("score", "fact", "session", "turns"):
        facts.add_column(col)
    for hit in reply.facts:
        facts.add_row(f"{hit.score:.3f}", hit.item.text, hit.item.source.session_id or "", ",".join(hit.item.source.turn_ids))
    console.print(facts)
    insights = Table(title="retrieved insights (with the facts they cite)")
    for col in ("score", "insight", "grounding"):
        insights.add_column(col)
    for hit in reply.insights:
        cited = reply.grounding.get(hit.item.id, [])
        insights.add_row(f"{hit.score:.3f}", hit.item.text, "\n".join(f"- {f.text}" for f in cited) or "(cited facts missing)")
    console.print(insights)


@app.command()
@friendly
def ingest(
    path: Path = typer.Argument(..., exists=True, help="dataset file (or folder for rolememo)"),
    dataset: str = typer.Option("rolememo", "--dataset", "-d", help=f"format: {', '.join(DATASETS)}"),
    persona: Path | None = typer.Option(None, "--persona", "-p", help="persona .json to write through (else the dataset's)"),
    sessions: int | None = typer.Option(None, "--sessions", help="ingest only the first N sessions"),
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    thread: str | None = typer.Option(None, "--thread", help="checkpoint thread id (re-run the same id to resume)"),
    user: str | None = typer.Option(None, "--user", "-u", help="user id of every history (default: each dialogue's own user)"),
) -> None:
    """Write facts and insights from a dialogue history into the store (resumable; several writers may run at once)."""
    from dualmem.datasets import load_dataset
    from dualmem.graphs.write import write_history
    from dualmem.stores.personas import load_persona_file, save_persona

    if dataset not in DATASETS:
        raise ConfigurationError(f"--dataset {dataset!r}: use one of {', '.join(DATASETS)}")
    settings = _settings(model, store)
    data = load_dataset(dataset, path)
    _preflight(settings, ("writer", "chat") if settings.emotion_strategy else ("writer",), checkpoints=True)
    failed = 0
    for item in data.items:
        who = load_persona_file(persona) if persona else item.dialogue.persona
        if who is None:
            raise ConfigurationError(f"{path} has no persona; pass --persona FILE.json")
        dialogue = item.dialogue.model_copy(update={"sessions": item.dialogue.sessions[:sessions] if sessions else item.dialogue.sessions})
        save_persona(settings.store_uri, who)
        namespace = (who.id, user or item.dialogue.user_id or settings.user_id)
        report = write_history(dialogue, who, settings=settings, thread_id=thread, namespace=namespace)
        _print_report(report, f"{who.id} / {namespace[1]}")
        failed += len(report.failed_chunks)
    console.print(f"memory stored in [bold]{settings.store_uri}[/]; checkpoints in {settings.checkpoint_path}", soft_wrap=True)
    if failed:
        _error(f"{failed} chunk(s) failed (listed above); run the same command again to retry only them")
        raise typer.Exit(EXIT_FAILED)


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
        console.print(f"  [yellow]failed[/] chunk {chunk['index']} ({chunk['chunk_id']}): {escape(str(chunk.get('error')))}", highlight=False, soft_wrap=True)
    for flag in flagged[:20]:
        console.print(f"  [magenta]flagged[/] {escape(flag['turn_id'])} ({flag['kind']}): {escape(flag['text'][:100])}", highlight=False, soft_wrap=True)
    if len(flagged) > 20:
        console.print(f"  … and {len(flagged) - 20} more flagged turn(s)")


@app.command()
@friendly
def ask(
    question: str = typer.Argument(..., help="the user's message"),
    persona: str = PersonaOpt,
    k: int | None = typer.Option(None, "--k", help="facts and insights retrieved (default settings.retrieval_k)"),
    mode: str | None = typer.Option(None, "--mode", help="dual or merged"),
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    show_memory: bool = typer.Option(True, "--show-memory/--no-show-memory", help="print retrieved memory"),
    user: str | None = UserOpt,
) -> None:
    """Answer one message in character from memory."""
    from dualmem.graphs.respond import respond
    from dualmem.stores.personas import find_persona

    settings = _settings(model, store, retrieval_k=k, retrieval_mode=mode, user_id=user)
    _preflight(settings, ("chat",))
    who = find_persona(settings.store_uri, persona)
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
    remember: bool = typer.Option(True, "--remember/--no-remember", help="form memory from the chat (in the background, a chunk at a time)"),
    user: str | None = UserOpt,
) -> None:
    """Chat in character; memory is retrieved every turn and (by default) formed from the chat in the background."""
    import uuid

    from dualmem.chat import FormationExecutor
    from dualmem.graphs.respond import respond
    from dualmem.stores import DualStore, LanceDBStore
    from dualmem.stores.personas import find_persona

    settings = _settings(model, store, user_id=user)
    _preflight(settings, ("chat", "writer") if remember else ("chat",))
    who = find_persona(settings.store_uri, persona)
    db = DualStore.from_settings(settings)
    formation = FormationExecutor() if remember else None
    if formation is not None:  # turns an earlier chat left pending (a crash, an exit before they were written)
        formation.recover(LanceDBStore(db.uri, dual=db), settings, namespace=(who.id, settings.user_id))
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
            reply = respond(message, who, settings=settings, store=db, history=history, remember=remember, thread_id=thread, formation=formation)
        except ModelCallError as exc:  # one failed message does not end the chat
            unanswered += 1
            _error(f"{exc}; your message was not answered (send it again)")
            continue
        history.append((message, reply.text))
        console.print(f"[bold]{escape(who.name)}>[/] {escape(reply.text)}", highlight=False)
        if reply.pending.get("flagged"):
            console.print(f"[magenta](memory guard)[/] your message asks to change {who.name}'s memory or beliefs; "
                          "it is kept only as a request, never as their insight", highlight=False)
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
    facts = sum(1 for r in applied for op in r.get("applied") or [] if op["stream"] == "fact" and op["op"] in ("ADD", "UPDATE"))
    insights = sum(1 for r in applied for op in r.get("applied") or [] if op["stream"] == "insight" and op["op"] in ("ADD", "UPDATE"))
    failed = [r for r in rows if r.get("status") == "failed"]
    if rows:
        console.print(f"memory formed: {len(applied)} chunk(s), {facts} fact(s) and {insights} insight(s) written", soft_wrap=True)
    for row in failed:
        _error(f"chunk {row['chunk_id']} was not written (its turns stay pending; `dualmem flush` retries): {row.get('error')}")
    for f in formed:
        if f.error:
            _error(f"thread {f.thread} was not written (its turns stay pending; `dualmem flush` retries): {f.error}")
    return len(failed) + sum(1 for f in formed if f.error)


@app.command()
@friendly
def flush(
    store: str | None = StoreOpt,
    model: str | None = ModelOpt,
    persona: str | None = typer.Option(None, "--persona", "-p", help="only this persona's chats (default: every persona)"),
    user: str | None = typer.Option(None, "--user", "-u", help="only this user's chats (with --persona)"),
    now: bool = typer.Option(False, "--now", help="also write the last, unfinished chunk of chats that are not quiet yet"),
) -> None:
    """Write chat turns left pending (after a crash, or an exit before they were written): full chunks, and quiet chats whole."""
    from dualmem.chat.formation import FormationRequest, run_formation
    from dualmem.chat.pending import PendingThread, pending_threads
    from dualmem.stores import LanceDBStore

    settings = _settings(model, store)
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
        console.print(f"{namespace[0]} / {namespace[1]} / {thread}: {len(result.rows)} chunk(s); {result.pending_turns} turn(s) still pending", soft_wrap=True)
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
) -> None:
    """List or search a persona's facts and insights (of one user)."""
    from dualmem.stores import DualStore
    from dualmem.stores.personas import find_persona

    settings = _settings(None, store, user_id=user)
    _preflight(settings)
    who = find_persona(settings.store_uri, persona)
    db = DualStore.from_settings(settings)
    namespace = (who.id, settings.user_id)
    status = None if all_status else "active"
    if kind not in (None, "fact", "insight"):
        raise ConfigurationError(f"--kind {kind!r}: use fact or insight")
    if search:
        rows = [(h.item, f"{h.score:.3f}") for h in db.search(namespace, search, kind=kind, k=limit, status=status)]  # type: ignore[arg-type]
    else:
        rows = [(i, "") for i in db.list(namespace, kind=kind, status=status, limit=limit)]  # type: ignore[arg-type]
    table = Table(title=f"{who.name}: {db.count(namespace, 'fact')} facts, {db.count(namespace, 'insight')} insights in {settings.store_uri}")
    for col in ("kind", "id", "text", "source", "grounding", "status", "score"):
        table.add_column(col)
    for item, score in rows:
        source = f"{item.source.session_id or ''} {','.join(item.source.turn_ids)}".strip()
        kind = f"{item.kind} (request)" if item.meta.get("guard") else item.kind  # what the user asked, not the persona's view
        table.add_row(kind, item.id, item.text, source, ",".join(item.grounding), item.status, score)
    console.print(table)


@app.command()
@friendly
def demo(
    store: str | None = typer.Option(None, "--store", help="where to write (default .dualmem/demo)"),
    model: str | None = ModelOpt,
    realmem_sessions: int = typer.Option(2, "--realmem-sessions", help="prefix of RealMem Sophie_Dubois to ingest too, if ../shared/data exists"),
) -> None:
    """Run the whole pipeline offline on the bundled sample with the bundled tiny model."""
    from dualmem.demo import run_demo
    from dualmem.preflight import check_models, check_store_uri

    check_store_uri(store or ".dualmem/demo")
    check_models(_settings(model), ("chat",))
    run_demo(store=store or ".dualmem/demo", model=model, realmem_sessions=realmem_sessions, console=console)


@app.command()
@friendly
def maintain(
    store: str | None = StoreOpt,
    cluster: bool = typer.Option(True, "--cluster/--no-cluster", help="gather each scattered namespace's rows together"),
) -> None:
    """Maintain a shared store: delete expired store items, gather namespaces, compact, fold rows into indexes.

    Safe while servers and writers use the store (run it from cron, say): a namespace is gathered
    under its write lease, and every reader sees the data before or after, never half.
    """
    from dualmem.stores import LanceDBStore

    settings = _settings(None, store)
    lg = LanceDBStore.from_settings(settings)
    swept = lg.sweep_ttl()
    gathered = lg.dual.optimize(cluster=cluster)
    console.print(
        f"{swept} expired store item(s) deleted; gathered {gathered['fact']} fact and {gathered['insight']} insight "
        f"namespace(s); tables compacted and indexed in {settings.store_uri}"
    )


@app.command()
def frameworks() -> None:
    """List the memory frameworks selectable with --framework."""
    from dualmem.frameworks import REGISTRY, framework_class

    table = Table(title="memory frameworks")
    table.add_column("name")
    table.add_column("what it is")
    for name in REGISTRY:
        try:
            desc = framework_class(name).description
        except Exception as exc:  # noqa: BLE001 - show broken entries instead of hiding them
            desc = f"[red]unavailable: {exc}[/]"
        table.add_row(name, desc)
    console.print(table)


def _set_options(pairs: list[str] | None) -> dict[str, Any]:
    """Turn ``--set name=value`` pairs into settings overrides (typed by the field's default)."""
    from dataclasses import fields

    from dualmem.config import ENV_PREFIX

    kinds = {f.name: type(f.metadata["env_default"]) for f in fields(Settings)}
    out: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, raw = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in kinds:
            raise ConfigurationError(f"--set {pair!r}: use NAME=VALUE with a setting of the README table "
                                     f"(e.g. --set retrieval_mode=merged); known: {', '.join(kinds)}")
        kind = kinds[name]
        try:
            out[name] = (raw.strip().lower() in {"1", "true", "yes", "on"}) if kind is bool else kind(raw)
        except ValueError:
            raise ConfigurationError(f"--set {pair!r}: {raw!r} is not a valid {kind.__name__} ({ENV_PREFIX}{name.upper()})") from None
    return out


def _eval_settings(model: str | None, store: str | None, framework: str | None, judge: str | None, overrides: dict[str, Any]) -> Settings:
    """Return the run's settings: explicit flags over ``--set`` over environment over defaults."""
    explicit = {"chat_model": model, "store_uri": store, "framework": framework, "judge_model": judge}
    return Settings.resolve(None, **{**overrides, **{k: v for k, v in explicit.items() if v is not None}})


@app.command(name="eval", context_settings={"allow_interspersed_args": True})
@friendly
def eval_(
    args: list[str] = typer.Argument(None, help="PATH of the dataset, `compare RUN_DIR...`, or `personality SOURCE`"),
    dataset: str = typer.Option("rolememo", "--dataset", "-d", help=f"format: {', '.join(DATASETS)}"),
    framework: str | None = typer.Option(None, "--framework", "-f", help="memory framework (see `dualmem frameworks`)"),
    judge: str | None = typer.Option(None, "--judge", help="judge model provider:model (default: settings.judge_model; none: no LLM judges)"),
    limit: int | None = typer.Option(None, "--limit", help="evaluate only the first N queries of each history"),
    out: Path | None = typer.Option(None, "--out", help="run directory (default runs/<dataset>-<framework>-<fingerprint>: re-running continues it)"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in this folder (its run.json holds the command)"),
    set_: list[str] | None = typer.Option(None, "--set", help="override a setting for this run, NAME=VALUE (repeatable; see the README table)"),
    upload: bool | None = typer.Option(None, "--upload/--no-upload", help="LangSmith experiment (default: upload when LANGSMITH_API_KEY is set)"),
    model: str | None = ModelOpt,
    store: str | None = StoreOpt,
    no_respond: bool = typer.Option(False, "--no-respond", help="retrieval metrics only, no in-character answers"),
    questionnaires: str = typer.Option("bfi,mbti", "--questionnaires", help="personality: bfi, mbti or both"),
    labels: Path | None = typer.Option(None, "--labels", help="personality: labels file {persona: {BFI: {dim: {score, type}}}}"),
    sessions: int | None = typer.Option(None, "--sessions", help="personality: ingest only the first N sessions of each history"),
    personas: str | None = typer.Option(None, "--personas", help="only these persona ids, comma-separated"),
) -> None:
    """Evaluate a framework (`dualmem eval -d realmem FILE -f NAME`), resume one (`--resume RUN`), compare runs, or test personality."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress is drawn by dualmem's own bars (langsmith and frameworks use tqdm)
    args = list(args or [])
    overrides = _set_options(set_)
    chosen = [p.strip() for p in personas.split(",") if p.strip()] if personas else None
    if args and args[0] == "compare":
        from dualmem.evals.run import compare

        if len(args) < 2:
            raise ConfigurationError("`dualmem eval compare` needs one or more run directories")
        compare([Path(a) for a in args[1:]], out=out)
        return
    if args and args[0] == "personality":
        from dualmem.evals.personality_run import run_personality

        if len(args) != 2:
            raise ConfigurationError("`dualmem eval personality SOURCE`: SOURCE is a dataset (with -d), a run folder, or ../shared/data/incharacter")
        settings = _eval_settings(model, store, framework, judge, overrides)
        run_dir = run_personality(Path(args[1]), dataset_kind=dataset, framework=settings.framework, settings=settings,
                                  questionnaires=questionnaires, labels=labels, sessions=sessions, personas=chosen, out=out)
        console.print(f"personality report: [bold]{run_dir}[/]")
        return
    from dualmem.evals.run import resume_eval, run_eval

    if resume is not None:
        if args:
            raise ConfigurationError("--resume RUN takes no dataset PATH: the run folder's run.json holds it")
        run_dir = resume_eval(resume, settings=overrides, upload=upload)
    else:
        if len(args) != 1:
            raise ConfigurationError("`dualmem eval` needs one dataset PATH (or `--resume RUN`, `compare RUN...`, `personality SOURCE`)")
        if dataset not in DATASETS:
            raise ConfigurationError(f"--dataset {dataset!r}: use one of {', '.join(DATASETS)}")
        settings = _eval_settings(model, store, framework, judge, overrides)
        if store:
            _preflight(settings)
        from dualmem.preflight import check_models

        check_models(settings, ("chat",) + (("judge",) if settings.judge_model else ()))
        run_dir = run_eval(dataset, Path(args[0]), settings.framework, judge=judge or settings.judge_model or None, limit=limit,
                           out=out, settings=settings, respond=not no_respond, personas=chosen, upload=upload)
    console.print(f"report: [bold]{run_dir}[/]")
    _eval_failures(run_dir)


def _eval_failures(run_dir: Path) -> None:
    """Say how many chunks, sessions and queries failed in a run; exit 1 when any did."""
    import json

    path = run_dir / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    ingest = summary.get("ingest") or {}
    chunks, sessions = int(ingest.get("failed_chunks") or 0), len(ingest.get("failed_sessions") or [])
    queries = int(summary.get("n_query_errors") or 0)
    console.print(f"{chunks} failed chunk(s), {sessions} failed session(s), {queries} quer(y/ies) with errors (see the report)", soft_wrap=True)
    if chunks or sessions or queries:
        raise typer.Exit(EXIT_FAILED)


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
        sizes = tuple(int(float(x.lower().rstrip("k")) * (1000 if x.lower().endswith("k") else 1)) for x in lengths.split(","))
    except ValueError:
        raise ConfigurationError(f"--lengths {lengths!r}: give token counts like 32k,64k,128k") from None
    settings = _settings(model)
    check_models(settings, ("chat", "judge"))
    run(personas, out, lengths=sizes, settings=settings, thread_id=thread, options={"n_per_type": per_type, "rounds": rounds})


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
    run(persona, out, sessions=sessions, settings=settings, framework=framework, thread_id=thread)


_mount_train()


def main() -> None:  # pragma: no cover - console entry
    """Run the CLI."""
    app(prog_name="dualmem")


if __name__ == "__main__":  # pragma: no cover
    main()
