"""Batch ingest: every history of a dataset file or folder written into one store, in threads or on a Ray cluster.

:func:`plan_histories` checks the input and lists one :class:`History` per
dialogue (its persona, its namespace, its sessions) before anything slow;
:func:`ingest_histories` saves each persona into the store, then writes the
histories — ``concurrency`` at a time in threads of this process, or, with
``ray_address``, one actor task per history on the cluster's workers
(:class:`dualmem.evals.cluster.RayRunner`), every model call under the run's
shared endpoint limits. Each history goes through
:func:`dualmem.writer.write_history`, exactly once per chunk (the writer's
ledger and namespace lease), so running the same ingest again — after a
crash, a lost node, from another machine — writes only what is missing. The
store must be one every worker reaches (object storage, a shared folder).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.evals.progress import progress_bars
from dualmem.schema import Dataset, Dialogue, Persona


@dataclass(frozen=True)
class History:
    """One history to write: through ``persona``, into ``namespace`` (persona id, user id)."""

    persona: Persona
    dialogue: Dialogue
    namespace: tuple[str, str]

    @property
    def label(self) -> str:
        """Return ``persona / user``."""
        return f"{self.namespace[0]} / {self.namespace[1]}"

    def write(self, settings: Settings, *, progress: bool = False) -> Any:
        """Write this history (in any process); return its :class:`~dualmem.writer.report.WriteReport`, whose ``cost``
        counts the model calls made (:mod:`dualmem.evals.cost`) against the tokens of the turns written now."""
        from dualmem.evals.cost import Meter, cost_summary
        from dualmem.models.tokens import count_tokens_batch
        from dualmem.writer import write_history

        with Meter().counting("writing") as meter:
            report = write_history(
                self.dialogue, self.persona, settings=settings, namespace=self.namespace, progress=progress
            )
        written = {t for row in report.chunks if row.get("status") != "skipped" for t in row.get("turn_ids") or []}
        texts = [t.text for s in self.dialogue.sessions for t in s.turns if t.id in written]
        read = sum(count_tokens_batch(texts)) if texts else 0
        report.cost = cost_summary(
            {self.label: {"phases": meter.phases(), "history_tokens": read}}, 0, settings.evaluation.prices
        )
        return report


def plan_histories(
    data: Dataset,
    settings: Settings,
    *,
    persona: Persona | None = None,
    sessions: int | None = None,
    user: str | None = None,
    source: str | Path = "the dataset",
) -> list[History]:
    """Return the histories of ``data`` to write (``persona`` instead of each dialogue's; the first ``sessions`` only;
    ``user`` instead of each dialogue's user); a history without a persona is a one-line error naming the fix."""
    out = []
    for item in data.items:
        who = persona or item.dialogue.persona
        if who is None:
            raise ConfigurationError(f"{source} has no persona; pass --persona FILE.json")
        dialogue = item.dialogue.model_copy(
            update={"sessions": item.dialogue.sessions[:sessions] if sessions else item.dialogue.sessions}
        )
        out.append(History(who, dialogue, (who.id, user or item.dialogue.user_id or settings.user)))
    return out


def ingest_histories(
    histories: Sequence[History],
    settings: Settings,
    *,
    on_report: Callable[[Any, History], None] | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> list[Any]:
    """Save the personas, write every history (threads, or the Ray cluster of ``ray_address``); return their reports in
    order, calling ``on_report(report, history)`` for each, in order, as soon as it and those before it are written."""
    from dualmem.stores.personas import save_personas

    if settings.ray_address:
        from dualmem.evals.cluster import check_address

        check_address(settings.ray_address)  # a bad address is one line, before anything is written
    save_personas(settings.store_uri, [h.persona for h in histories], settings.store_options)  # one commit
    if len(histories) == 1 and not settings.ray_address:  # one history: its own bar, chunk by chunk
        report = histories[0].write(settings, progress=progress)
        if on_report is not None:
            on_report(report, histories[0])
        return [report]
    console = console or Console(stderr=True)
    reports: list[Any] = [None] * len(histories)
    runner: Any = None
    with progress_bars(console, enabled=progress) as (bar, advance):
        task = bar.add_task("histories written", total=len(histories))
        if settings.ray_address:
            from dualmem.evals.cluster import RayRunner
            from dualmem.evals.unit import UnitEnv

            runner = RayRunner(
                UnitEnv(settings=settings, records={}, stores={}, on_ingest=lambda _h: advance(task)),
                settings.ray_address,
                units=len(histories),
            )

            def write(history: History) -> Any:
                return runner.write(history)
        else:

            def write(history: History) -> Any:
                report = history.write(settings)
                advance(task)
                return report

        try:
            with ThreadPoolExecutor(max_workers=max(1, min(settings.evaluation.concurrency, len(histories)))) as pool:
                for i, report in enumerate(pool.map(write, histories)):
                    reports[i] = report
                    if on_report is not None:
                        on_report(report, histories[i])
        finally:
            if runner is not None:
                runner.close(cancel=True)
    return reports
