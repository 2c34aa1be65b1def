"""The weave graph end to end on a scripted fake: outputs load, rejections are recorded, runs resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.gen_fakes import WeaveScript, weave_model

from dualmem.config import Settings
from dualmem.datasets import load_dataset
from dualmem.generate import generate_rolememo, read_persona
from dualmem.schema import TASK_TYPES
from dualmem.testing import HashEmbeddings

PERSONAS = Path(__file__).resolve().parent / "fixtures" / "personas"
OPTIONS = {"n_per_type": 2, "rounds": 8, "min_rounds": 4}


def settings_for(tmp_path: Path) -> Settings:
    return Settings(checkpoint_path=str(tmp_path / "ckpt.sqlite"), embedder="hash:64", concurrency=1, max_retries=1)


def run(tmp_path, model, *, thread="t1", lengths=(2000, 4000), options=OPTIONS, out="out"):
    return generate_rolememo(
        PERSONAS,
        tmp_path / out,
        lengths=lengths,
        model=model,
        settings=settings_for(tmp_path),
        thread_id=thread,
        embeddings=HashEmbeddings(64),
        options=options,
    )


def test_read_persona_normalises_free_form_keys():
    mara = read_persona(PERSONAS / "mara.json")
    assert mara.id == "mara" and mara.description.startswith("Former ICU")
    assert mara.core_values[0].startswith("rest is") and mara.traits == [
        "warm but blunt",
        "notices small details",
        "practical",
    ]
    assert read_persona(PERSONAS / "chen.json").id == "chen-wei"


def test_a_persona_saved_by_the_schema_reads_back_whole(tmp_path):
    mara = read_persona(PERSONAS / "mara.json").model_copy(update={"personality": {"big5": {"openness": "high"}}})
    path = tmp_path / "saved.json"
    path.write_text(mara.model_dump_json())
    assert read_persona(path) == mara


def test_persona_list_strings_split_on_semicolons_and_lines_not_commas(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {"name": "Ana", "core values": "check twice, sail once; the sea keeps no promises", "traits": "calm, exact"}
        )
    )
    ana = read_persona(path)
    assert ana.core_values == ["check twice, sail once", "the sea keeps no promises"]
    assert ana.traits == ["calm, exact"]


def test_generates_loadable_dataset_with_manifest(tmp_path):
    script = WeaveScript(
        generic=("Value Judgment insight 0",),
        easy=("Decision Guidance insight 1",),
        broken=("Interpretive Attribution insight 1",),
        echo=("Contradiction Revelation insight 1",),
    )
    out = run(tmp_path, weave_model(script))
    manifest = json.loads((out / "manifest.json").read_text())
    # 2 personas x 4 types x 2 insights = 16; per persona 4 rejected (one per stage) -> 4 kept each
    assert manifest["insights"] == 16 and manifest["queries_kept"] == 8
    checks = manifest["checks"]
    assert checks["ideation"]["pass_rate"] == 1.0
    assert checks["specificity"]["passed"] == 14 and checks["specificity"]["total"] == 16
    assert checks["fragments"]["total"] == 14 and checks["fragments"]["passed"] == 12
    assert checks["necessity"]["passed"] == 10 and checks["difficulty"]["passed"] == 8
    stages = {r["stage"] for r in manifest["rejections"]}
    assert stages == {"specificity", "fragments", "necessity", "difficulty"}
    broken = [r for r in manifest["rejections"] if r["stage"] == "fragments"]
    assert all("invalid after 2 attempt" in r["reason"] for r in broken)  # recorded with its reason, not dropped
    echoed = [r for r in manifest["rejections"] if r["stage"] == "difficulty"]
    assert all("echoed" in r["reason"] for r in echoed)
    # reasons are grouped by kind (no fragment text, no turn numbers), and every pass rate adds up with its rejections
    assert checks["difficulty"]["rejections"] == {"fragment N is echoed by the agent in turns": 2}
    assert checks["fragments"]["rejections"] == {"model output invalid after N attempt(s)": 2}
    for name, row in checks.items():
        assert row["total"] - row["passed"] == sum(row["rejections"].values()), name
    for length, folder in ((2000, "2k"), (4000, "4k")):
        ds = load_dataset("rolememo", out / folder)
        assert len(ds.items) == 2
        for item in ds.items:
            assert len(item.queries) == 4
            assert {q.task_type for q in item.queries} <= set(TASK_TYPES)
            total = item.dialogue.meta["assembly"]["total_tokens"]
            assert abs(total - length) <= 0.05 * length
            for q in item.queries:
                assert len(q.gold.turn_ids) == 2 and len(q.meta["evidence_depths"]) == 2
    assert len(manifest["histories"]) == 4 and all(h["within_tolerance"] for h in manifest["histories"])


def test_ideation_pass_rate_counts_the_drafts_it_rejected(tmp_path):
    class Thin(WeaveScript):
        def __call__(self, messages, tool):
            out = super().__call__(messages, tool)
            if tool == "InsightBatch":  # one extra draft of one kind only: rejected, the two others kept
                out["insights"].append({"text": "thin", "reasoning_steps": ["a", "b"], "fact_kinds": ["work", "Work"]})
                out["insights"].insert(0, out["insights"].pop())
            return out

    out = run(tmp_path, weave_model(Thin()), lengths=(2000,))
    ideation = json.loads((out / "manifest.json").read_text())["checks"]["ideation"]
    assert ideation["passed"] == 16 and ideation["total"] == 24 and ideation["pass_rate"] == round(16 / 24, 4)
    assert (
        ideation["rejections"] == {"needs >= N reasoning steps and >= N fact kinds": 8} and ideation["shortfall"] == 0
    )


def test_killed_run_resumes_without_regenerating(tmp_path):
    first = weave_model(WeaveScript(kill_on="Value Judgment insight 1 of Mara"))
    with pytest.raises(KeyboardInterrupt, match="killed"):
        run(tmp_path, first, thread="resume")
    asked_first = [m for m in first.calls if "INSIGHTS of the task type" in str(m[-1].content)]
    assert len(asked_first) == 8  # both personas ideated before the crash

    def finished(model):
        # insights whose fragments were asked and answered (not the one that crashed)
        return {
            str(m[-1].content).split("## Insight (", 1)[1].split("\n")[1]
            for m in model.calls
            if "write the test material" in str(m[-1].content)
        }

    second = weave_model()
    out = run(tmp_path, second, thread="resume")
    assert not [m for m in second.calls if "INSIGHTS of the task type" in str(m[-1].content)]  # no re-ideation
    done_before = finished(first) - {"Value Judgment insight 1 of Mara Okafor"}
    assert done_before and not (finished(second) & done_before)  # finished branches were not redone
    assert "Value Judgment insight 1 of Mara Okafor" in finished(second)

    fresh = weave_model()
    run(tmp_path, fresh, thread="fresh", out="out-fresh")
    resumed = json.loads((out / "manifest.json").read_text())
    clean = json.loads((tmp_path / "out-fresh" / "manifest.json").read_text())
    assert resumed["queries_kept"] == clean["queries_kept"] == 16
    # only the crashed branch's two calls (specificity, the crashing fragments call) are made twice
    assert len(first.calls) + len(second.calls) == len(fresh.calls) + 2
    # a finished thread re-run asks nothing at all
    again = weave_model()
    run(tmp_path, again, thread="resume")
    assert again.calls == []


def test_weave_parts_split_long_dialogues():
    from dualmem.generators.weave import weave_parts

    assert weave_parts(24, 6) == [6, 6, 6, 6]
    assert weave_parts(10, 6) == [5, 5]
    assert weave_parts(5, 6) == [5] and weave_parts(24, 0) == [24]
    assert sum(weave_parts(25, 6)) == 25


def test_reusing_a_thread_with_other_options_is_refused(tmp_path):
    from dualmem.errors import ConfigurationError

    run(tmp_path, weave_model(), thread="t-opts", lengths=(2000,), options={**OPTIONS, "n_per_type": 1})
    with pytest.raises(ConfigurationError, match="new thread id"):
        run(tmp_path, weave_model(), thread="t-opts", lengths=(4000,), options={**OPTIONS, "n_per_type": 1})
