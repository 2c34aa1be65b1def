"""`dualmem train` CLI: help documents every flag; export-sft and the VeRL preparation run from RoleMemo files."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from fixtures.train_data import make_dataset
from typer.testing import CliRunner

from dualmem.datasets import dump_rolememo
from dualmem.training.cli import train_app
from dualmem.training.grpo_trl import GRPORunConfig
from dualmem.training.sft import SFTRunConfig
from dualmem.training.verl.config import VerlRunConfig

runner = CliRunner()


def test_help_lists_every_config_field():
    sft = runner.invoke(train_app, ["sft", "--help"], terminal_width=200).output
    rl = runner.invoke(train_app, ["rl", "--help"], terminal_width=200).output
    flat_sft, flat_rl = " ".join(sft.split()), " ".join(rl.split())
    assert all(f"--{f.name}" in flat_sft for f in fields(SFTRunConfig))
    assert all(f"--{f.name}" in flat_rl for f in fields(GRPORunConfig)) and all(
        f"--{f.name}" in flat_rl for f in fields(VerlRunConfig)
    )
    assert "paper: 1e-5" in flat_sft


def test_export_sft_from_rolememo_files(tmp_path):
    data = tmp_path / "rolememo"
    dump_rolememo(make_dataset(3), data)
    out = tmp_path / "sft"
    result = runner.invoke(
        train_app,
        [
            "export-sft",
            "--data",
            str(data),
            "--out",
            str(out),
            "--chunk-tokens",
            "60",
            "--eval-ratio",
            "0.34",
            "--embedder",
            "hash:64",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "export_report.json").read_text())
    assert report["train"] > 0 and report["eval"] > 0 and not report["invalid"]
    assert (out / "dataset_info.json").exists()


def test_export_sft_without_input_names_the_fix(tmp_path):
    result = runner.invoke(train_app, ["export-sft", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--data" in result.output


def test_rl_verl_prepare_writes_data_and_launch_yaml(tmp_path):
    data = tmp_path / "rolememo"
    dump_rolememo(make_dataset(2), data)
    result = runner.invoke(
        train_app,
        [
            "rl",
            "--engine",
            "verl",
            "--data",
            str(data),
            "--model_path",
            "some/model",
            "--data_dir",
            str(tmp_path / "vd"),
            "--output_dir",
            str(tmp_path / "run"),
            "--chunk_tokens",
            "200",
            "--memory_embedder",
            "hash:64",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "vd" / "train.parquet").exists() and 'memory_embedder: "hash:64"' in (
        tmp_path / "vd" / "agent_loop.yaml"
    ).read_text()
    launch = (tmp_path / "run" / "verl_launch.yaml").read_text()
    assert "algorithm.adv_estimator=grpo" in launch and "actor_rollout_ref.model.path=some/model" in launch


def test_rl_verl_launch_with_the_hf_rollout_loads_it_in_verl(tmp_path, monkeypatch):
    """--launch starts VeRL with the hf backend registered in every process; an unknown engine is a one-line error."""
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: calls.append((cmd, env)) or 0)
    args = [
        "rl",
        "--engine",
        "verl",
        "--no-prepare",
        "--launch",
        "--model_path",
        "m",
        "--data_dir",
        str(tmp_path / "vd"),
        "--output_dir",
        str(tmp_path / "run"),
        "--python",
        "/usr/bin/python3",
    ]
    result = runner.invoke(train_app, [*args, "--rollout_engine", "hf"])
    assert result.exit_code == 0, result.output
    ((cmd, env),) = calls
    assert cmd[:3] == ["/usr/bin/python3", "-m", "verl.trainer.main_ppo"] and "actor_rollout_ref.rollout.name=hf" in cmd
    assert "dualmem.training.verl.hf_rollout" in env["VERL_USE_EXTERNAL_MODULES"].split(",")
    bad = runner.invoke(train_app, [*args, "--rollout_engine", "tgi"])
    assert (
        bad.exit_code != 0 and "rollout_engine 'tgi' is not one of vllm, sglang, hf" in bad.output and len(calls) == 1
    )


def test_verl_validation_holds_the_named_personas(tmp_path):
    import pandas as pd

    from dualmem.training.verl.dataset import write_verl_dataset

    ds = make_dataset(3)
    held = ds.items[0].dialogue.persona.id
    counts = write_verl_dataset(ds, tmp_path / "vd", chunk_tokens=200, val_personas=[held])
    val, train = (pd.read_parquet(tmp_path / "vd" / f"{n}.parquet") for n in ("val", "train"))
    assert counts["val"] == len(val) > 0 and counts["train"] == len(train) > 0
    from dualmem.training.verl.dataset import load_episodes

    persona = {k: e.persona.id for k, e in load_episodes(tmp_path / "vd" / "episodes.jsonl").items()}
    assert {persona[x["episode_id"]] for x in val["extra_info"]} == {held}
    assert held not in {persona[x["episode_id"]] for x in train["extra_info"]}
    with pytest.raises(ValueError, match="val_personas: no history of nobody"):
        write_verl_dataset(ds, tmp_path / "vd2", chunk_tokens=200, val_personas=["nobody"])


@pytest.mark.parametrize("module", ["dualmem.training.sft", "dualmem.training.grpo_trl"])
def test_module_help_lists_every_field_and_unknown_flags_are_one_line_errors(module, capsys):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--output_dir" in out and ("warm-up (paper: 5%)" in out or module.endswith("grpo_trl"))
    with pytest.raises(SystemExit) as done:
        main(["--output_dir", "x", "--bogus", "1"])
    assert done.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: unknown flag(s) --bogus")
