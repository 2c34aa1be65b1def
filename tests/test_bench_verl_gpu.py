"""benchmarks/verl_gpu.py: VeRL's console lines parse into the recorded result (the README's GPU figures)."""

from __future__ import annotations

import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from verl_gpu import parse_log

RESULTS = REPO / "benchmarks" / "results"


def test_parse_reads_numpy_reprs_exponents_and_prefixes():
    steps, vals = parse_log(
        "(TaskRunner pid=1) step:0 - val-core/w/reward/mean@8:np.float64(-0.049999999813735485) - val-aux/w/parsed_share/mean@8:0.75\n"
        "noise step - nothing\n"
        "step:3 - critic/score/mean:np.float64(0.25) - actor/pg_loss:-1.5e-05 - timing_s/step:12.3 - training/epoch:0\n"
    )
    assert vals == [{"step": 0, "w/reward/mean@8": -0.05, "w/parsed_share/mean@8": 0.75}]
    assert steps == [{"step": 3, "critic/score/mean": 0.25, "actor/pg_loss": -1.5e-05, "timing_s/step": 12.3}]


def test_the_recorded_gpu_run_is_what_verls_lines_say():
    result = json.loads((RESULTS / "verl_gpu_h100.json").read_text())
    steps, vals = parse_log((RESULTS / "verl_gpu_h100_steps.log").read_text())
    assert (steps, vals) == (result["train_steps"], result["validation"])
    reward = {v["step"]: v["dualmem/rolememo-writer/reward/mean@8"] for v in vals}
    assert reward == {0: -0.05, 4: -0.03125}  # README: -0.050 before training, -0.031 after step 4
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5] and result["versions"]["verl"] == "0.9.1"
    parsed = {v["step"]: v["dualmem/rolememo-writer/parsed_share/mean@8"] for v in vals}
    assert parsed == {0: 0.75, 4: 0.78125}  # README: parsed turns 75 % -> 78 %
    step_s = [s["timing_s/step"] for s in steps]
    gen_new = [s["timing_s/gen"] for s in steps if s["timing_s/gen"] > 1]  # steps that played new episodes
    update = [s["timing_s/update_actor"] for s in steps]
    assert (round(min(step_s)), round(max(step_s))) == (23, 57)  # README: a step took 23-57 s
    assert (round(min(gen_new)), round(max(gen_new))) == (23, 36) and (round(min(update)), round(max(update))) == (
        11,
        17,
    )
    assert "H100" in result["device"]
