"""`dualmem train`: export SFT data, run SFT, run GRPO with TRL (one machine) or VeRL (cluster).

Heavy libraries (torch, TRL, VeRL) are imported only when a command runs.
``sft`` and ``rl`` forward ``--field value`` flags to their config dataclasses;
every field is listed, with its default and help, in the command's ``--help``.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import MISSING, fields
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dualmem.config import setting_default
from dualmem.errors import ConfigurationError, DatasetError
from dualmem.training.run_config import GRPORunConfig
from dualmem.training.sft import SFTRunConfig
from dualmem.training.verl.config import VerlRunConfig

console = Console()
err = Console(stderr=True)
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _fields_help(cls: type) -> str:
    rows = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
        rows.append(f"--{f.name} (default {default!r}): {f.metadata.get('help', '')}")
    return "\n\n".join(rows)


train_app = typer.Typer(
    help="Train the writer model: SFT export, SFT, GRPO (TRL / VeRL).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


def _parse(cls: type, args: list[str]) -> Any:
    from dualmem.training.flags import parse_flags

    try:
        cfg = parse_flags(cls, args)
    except SystemExit as exc:
        raise typer.Exit(int(exc.code or 0)) from None
    return cfg


def _load(paths: list[Path], kind: str = "rolememo") -> Any:
    from dualmem.datasets import load_dataset
    from dualmem.schema import Dataset

    items, names = [], []
    for path in paths:
        ds = load_dataset(kind, path)
        items += ds.items
        names.append(ds.name)
    return Dataset(name="+".join(names), source=",".join(map(str, paths)), items=items)


@train_app.command("export-sft")
def export_sft_cmd(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="output folder (train.jsonl, eval.jsonl, dataset_info.json)")
    ] = Path("runs/sft"),
    data: Annotated[
        list[Path] | None,
        typer.Option("--data", "-d", help="RoleMemo file or folder (repeatable): targets from gold, no teacher"),
    ] = None,
    traces: Annotated[
        list[Path] | None,
        typer.Option("--traces", "-t", help="teacher trace JSONL (repeatable): {messages, output, persona_id, meta}"),
    ] = None,
    realmem: Annotated[
        list[Path] | None,
        typer.Option(
            "--realmem",
            "-r",
            help="RealMem file or folder (repeatable): its memory points as fact targets, insights out of the loss",
        ),
    ] = None,
    max_chunks: Annotated[int | None, typer.Option(help="RealMem: only the first N chunks of each history")] = None,
    chunk_tokens: Annotated[
        int, typer.Option(help="writer chunk size in tokens (use the writer's chunk_tokens)")
    ] = setting_default("chunk_tokens"),
    view_k: Annotated[
        int, typer.Option(help="relevant items per stream in the writer's working view")
    ] = setting_default("view_k"),
    view_recent: Annotated[int, typer.Option(help="newest items per stream always in the view")] = setting_default(
        "view_recent"
    ),
    embedder: Annotated[
        str,
        typer.Option(help="embedder of the working view's memory (its search, dedup); empty: the embedder setting's"),
    ] = "",
    keep_empty: Annotated[
        float, typer.Option(help="share of chunks with nothing to write that are kept (targets: empty update)")
    ] = 0.2,
    eval_ratio: Annotated[float, typer.Option(help="share of personas held out for evaluation")] = 0.1,
    seed: Annotated[int, typer.Option(help="seed of the persona split")] = 0,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict/--no-strict", help="fail on any invalid record (else drop it and list it in the report)"
        ),
    ] = True,
) -> None:
    """Build writer SFT data: chat JSONL with the writer's exact prompt, split by persona, plus LLaMA-Factory info."""
    from dualmem.training.export import export_sft

    data, traces, realmem = data or [], traces or [], realmem or []
    if not data and not traces and not realmem:
        _fail(
            ConfigurationError(
                "nothing to export: pass --data (RoleMemo), --realmem (RealMem) and/or --traces (teacher JSONL)"
            )
        )
    try:
        report = export_sft(
            out,
            dataset=_load(data) if data else None,
            traces=traces,
            chunk_tokens=chunk_tokens,
            view_k=view_k,
            view_recent=view_recent,
            keep_empty=keep_empty,
            eval_ratio=eval_ratio,
            seed=seed,
            strict=strict,
            progress=True,
            realmem=_load(realmem, "realmem") if realmem else None,
            max_chunks=max_chunks,
            embedder=embedder or None,
        )
    except (ConfigurationError, DatasetError) as exc:
        _fail(exc)
    console.print(
        f"[green]wrote[/] {report.train} train / {report.eval} eval records to {out} "
        f"({len(report.personas_train)} / {len(report.personas_eval)} personas; sources {report.by_source}; {len(report.invalid)} invalid)"
    )


@train_app.command(
    "sft",
    context_settings=PASS_THROUGH,
    help="Fine-tune the writer with TRL's SFTTrainer (full or LoRA). Flags:\n\n" + _fields_help(SFTRunConfig),
)
def sft_cmd(ctx: typer.Context) -> None:
    from dualmem.training.sft import train_sft

    cfg = _parse(SFTRunConfig, list(ctx.args))
    try:
        out = train_sft(cfg)
    except ConfigurationError as exc:
        _fail(exc)
    console.print(f"[green]done[/] train loss {out['train_loss']:.4f}; model in {cfg.output_dir}")


class Engine(StrEnum):
    """RL engines."""

    trl = "trl"
    verl = "verl"


RL_HELP = (
    "GRPO on the writer. --engine trl: one machine, TRL GRPOTrainer with recurrent writing episodes. "
    "--engine verl: write VeRL's parquet data, agent-loop registration and a documented launch YAML; --launch starts "
    "`python -m verl.trainer.main_ppo` (Ray, vLLM/SGLang or transformers (hf) rollouts, FSDP actor).\n\nTRL flags:\n\n"
    + _fields_help(GRPORunConfig)
    + "\n\nVeRL flags:\n\n"
    + _fields_help(VerlRunConfig)
)


@train_app.command("rl", context_settings=PASS_THROUGH, help=RL_HELP)
def rl_cmd(
    ctx: typer.Context,
    engine: Annotated[
        Engine, typer.Option("--engine", "-e", help="trl (one machine) or verl (Ray cluster)")
    ] = Engine.trl,
    data: Annotated[
        list[Path] | None,
        typer.Option(
            "--data", "-d", help="RoleMemo file or folder (repeatable; trl: RealMem with --data_format realmem)"
        ),
    ] = None,
    prepare: Annotated[
        bool, typer.Option("--prepare/--no-prepare", help="verl: (re)write the parquet data from --data")
    ] = True,
    launch: Annotated[
        bool, typer.Option("--launch/--no-launch", help="verl: start the VeRL run after writing the config")
    ] = False,
    python: Annotated[
        str,
        typer.Option(
            "--python", help="verl: interpreter with verl installed (default: .venv-verl/bin/python if present)"
        ),
    ] = "",
) -> None:
    data = data or []
    if engine is Engine.trl:
        from dualmem.training.grpo_trl import train_grpo

        cfg = _parse(GRPORunConfig, list(ctx.args))
        try:
            train_grpo(cfg, dataset=_load(data, cfg.data_format) if data else None)
        except (ConfigurationError, DatasetError) as exc:
            _fail(exc)
        console.print(f"[green]done[/] policy in {cfg.output_dir}")
        return
    vcfg = _parse(VerlRunConfig, list(ctx.args))
    try:
        if prepare:
            if not data:
                raise ConfigurationError(
                    "--engine verl --prepare needs --data (RoleMemo), or pass --no-prepare to reuse data_dir"
                )
            from dualmem.training.verl.dataset import write_verl_dataset

            counts = write_verl_dataset(
                _load(data), vcfg.data_dir, chunk_tokens=vcfg.chunk_tokens, memory_embedder=vcfg.memory_embedder
            )
            console.print(f"[green]data[/] {json.dumps(counts)}")
        from dualmem.training.verl.config import launch_env, overrides, verl_python, write_launch

        path = write_launch(vcfg, python=python)
        console.print(f"[green]launch config[/] {path}")
        if launch:
            cmd = [verl_python(python), "-m", "verl.trainer.main_ppo", *overrides(vcfg)]
            console.print(" ".join(cmd))
            raise typer.Exit(subprocess.call(cmd, env=launch_env(rollout_engine=vcfg.rollout_engine)))
    except (ConfigurationError, DatasetError) as exc:
        _fail(exc)
