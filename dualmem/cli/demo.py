"""`dualmem demo`: the whole pipeline offline on the bundled sample and the bundled tiny model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel

from dualmem.config import Settings

REALMEM_SOPHIE = Path("..") / "shared" / "data" / "realmem" / "Sophie_Dubois_dialogues_256k.json"


def run_demo(
    *,
    store: str,
    model: str | None = None,
    realmem_sessions: int = 0,
    reply_tokens: int = 160,
    console: Console | None = None,
) -> dict[str, Any]:
    """Ingest the sample (and a RealMem prefix when asked and present), answer its queries, print everything.

    Replies are capped at ``reply_tokens`` (a chat turn, not an essay); the writer keeps the settings' budget.
    """
    from dualmem.cli.common import _print_memory
    from dualmem.datasets import load_dataset, load_sample
    from dualmem.graphs.respond import respond
    from dualmem.stores.personas import save_persona
    from dualmem.writer import write_history

    console = console or Console()
    root = Path(store)
    settings = Settings.resolve(
        None, chat_model=model, store_uri=str(root / "lancedb"), checkpoint_path=str(root / "checkpoints.sqlite")
    )
    started = time.perf_counter()
    sample = load_sample()
    persona = sample.dialogue.persona
    assert persona is not None, "the bundled sample has a persona"
    console.print(Panel(persona.render(), title=f"persona: {persona.name}", expand=False))
    save_persona(settings.store_uri, persona, settings.store_options)
    console.print(f"writing memory with [bold]{settings.writer}[/] from {len(sample.dialogue.sessions)} sessions…")
    reports = {"sample": write_history(sample.dialogue, persona, settings=settings)}

    realmem = REALMEM_SOPHIE if REALMEM_SOPHIE.exists() else Path(__file__).resolve().parents[1] / REALMEM_SOPHIE
    if realmem_sessions > 0 and realmem.exists():
        item = load_dataset("realmem", realmem).items[0]
        prefix = item.dialogue.model_copy(update={"sessions": item.dialogue.sessions[:realmem_sessions]})
        who = prefix.persona or persona
        save_persona(settings.store_uri, who, settings.store_options)
        console.print(f"also ingesting the first {realmem_sessions} RealMem sessions of {who.name} ({realmem})…")
        reports["realmem"] = write_history(prefix, who, settings=settings)
    elif realmem_sessions > 0:
        console.print("[dim]../shared/data not found: skipping the RealMem prefix[/]")

    for name, report in reports.items():
        console.print(
            f"[green]{name}[/]: {len(report.chunks)} chunks, {report.facts_written} facts and "
            f"{report.insights_written} insights written, {len(report.failed_chunks)} chunk(s) failed"
        )
    answers = []
    replying = settings.replace(max_new_tokens=min(reply_tokens, settings.tuning.max_new_tokens))
    for query in sample.queries:
        console.rule(f"[bold]{query.task_type or 'query'}[/]: {query.text}")
        reply = respond(query.text, persona, settings=replying)
        _print_memory(reply)
        console.print(f"[bold]{persona.name}:[/] {reply.text}")
        answers.append({"query": query.text, "reply": reply.text})
    console.rule()
    console.print(
        f"memory: [bold]{settings.store_uri}[/] (inspect with `dualmem inspect --persona {persona.id} --store {settings.store_uri}`)"
    )
    console.print(f"checkpoints: {settings.checkpoint_path}; took {time.perf_counter() - started:.0f} s")
    return {"reports": reports, "answers": answers, "store": settings.store_uri}
