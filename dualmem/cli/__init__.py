"""The `dualmem` command: ingest, ask, chat, flush, inspect, maintain, demo, frameworks, eval, generate, train, ui.

Commands live by theme (:mod:`~dualmem.cli.memory`, :mod:`~dualmem.cli.runs`);
what they share — apps, options, exit codes, errors, preflight — in :mod:`~dualmem.cli.common`.
"""

from __future__ import annotations

from dualmem.cli import control, memory, runs  # noqa: F401 - registers the commands on `app`
from dualmem.cli.common import EXIT_FAILED, EXIT_MISCONFIGURED, _set_options, app


def _mount_train() -> None:
    try:
        from dualmem.training.cli import train_app
    except ImportError:  # training extras not installed
        return
    app.add_typer(train_app, name="train", help="Train the writer model: SFT export, SFT, GRPO (TRL / VeRL).")


_mount_train()


def main() -> None:  # pragma: no cover - console entry
    """Run the CLI."""
    app(prog_name="dualmem")


__all__ = ["EXIT_FAILED", "EXIT_MISCONFIGURED", "_set_options", "app", "main"]
