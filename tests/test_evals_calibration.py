"""Judge calibration: wrong-but-on-topic and faithful answers built from gold; a lenient judge measured lenient, a strict one
not; the run report shows the leniency beside the judge scores, in a real headless Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import LOCOMO, need
from fixtures.chromium import Browser

from dualmem.config import Settings
from dualmem.datasets import load_dataset, load_sample, sample_path
from dualmem.errors import ConfigurationError
from dualmem.evals.calibration import ROLEPLAY_KEYS, calibrate, rates
from dualmem.evals.fakes import TurnLogFramework
from dualmem.evals.perturb import candidates, change_numbers, negate, swap_entities
from dualmem.evaluate import calibrate_judge, resume_eval, run_eval
from dualmem.frameworks import FrameworkContext
from dualmem.testing import FakeChatModel

SETTINGS = Settings(embedder="hash:64", judge_repetitions=1, concurrency=2)
NEGATION = re.compile(r"\bnot\b|n't\b|\bnever\b|\bcannot\b|\bno\b", re.I)
NUMBERS = re.compile(
    r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten|twelve|fourteen|sixteen|twenty|forty|sixty"
    r"|first|second|third|monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march"
    r"|april|may|june|july|august|september|october|november|december)\b",
    re.I,
)


def _facts(text: str) -> tuple[Any, ...]:
    """What a careful grader checks: names mid-sentence, numbers and dates, negations per sentence, the content words
    (an opening like "As I recall:" ignored)."""
    text = re.sub(r"^(as i recall|as far as i remember)[:,]\s*", "", text.replace("’", "'"), flags=re.I)
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s]
    names = {m.group(0) for s in sentences for m in re.finditer(r"(?<=\s)[A-Z][a-z]+", s) if m.group(0) != "I"}
    return (
        names,
        sorted(n.lower() for n in NUMBERS.findall(text)),
        [len(NEGATION.findall(s)) for s in sentences],
        {w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)},
    )


def same_as_gold(answer: str, gold: str) -> bool:
    """Return whether ``answer`` states what ``gold`` states (a strict grader, tolerant of rewording)."""
    a, g = _facts(answer), _facts(gold)
    return a[:3] == g[:3] and (not g[3] or len(a[3] & g[3]) / len(g[3]) >= 0.8)


def comparing_judge(gold_of: dict[str, str]) -> FakeChatModel:
    """A scripted judge that grades the answer in its prompt against the gold answer of the question it names."""

    def verdict(messages: list[Any]) -> dict[str, Any]:
        prompt = str(messages[-1].content)
        if "Gold answer:" in prompt:  # LoCoMo correctness (0/1)
            gold = prompt.split("Gold answer:", 1)[1].split("\nGenerated answer:", 1)[0].strip()
            return {
                "reasoning": "compared",
                "score": int(same_as_gold(prompt.split("Generated answer:", 1)[1].strip(), gold)),
            }
        answer = prompt.split("## Assistant answer to evaluate", 1)[1].strip()
        gold = next(g for q, g in gold_of.items() if q in prompt)
        return {"reasoning": "compared", "score": 5 if same_as_gold(answer, gold) else 1}

    return FakeChatModel(responses=[verdict], cycle=True)


def accepting_judge() -> FakeChatModel:
    """A scripted judge that accepts everything (LoCoMo 1, RealMem 3, role-play 5)."""

    def verdict(messages: list[Any]) -> dict[str, Any]:
        prompt = str(messages[-1].content)
        return {
            "reasoning": "fine",
            "score": 1 if "Gold answer:" in prompt else 3 if "Reference answer:" in prompt else 5,
        }

    return FakeChatModel(responses=[verdict], cycle=True)


def _sample_gold() -> dict[str, str]:
    return {q.text: str(q.answer) for q in load_sample().queries}


def test_perturbations_are_deterministic_on_topic_and_wrong():
    made = candidates(load_sample())
    assert made == candidates(load_sample())  # no randomness
    kinds = {c["kind"] for c in made}
    assert kinds == {"gold", "paraphrase", "entity", "number", "negation", "other-answer"}
    for cand in made:
        assert cand["faithful"] == (cand["kind"] in ("gold", "paraphrase"))
        assert (cand["answer"] == cand["reference_answer"]) == (cand["kind"] == "gold")
    by = {(c["query_id"], c["kind"]): c["answer"] for c in made}
    assert "Sunday climbing" in by[("q-interpret-snappy", "entity")]  # another answer's weekday, same persona
    assert by[("q-decide-evening-rounds", "other-answer")] == load_sample().queries[2].answer
    assert (
        swap_entities("Yesterday Caroline went to Paris with her sister.", ["Melanie", "London"])
        == "Yesterday Melanie went to London with her sister."
    )  # names, not the sentence's opening word
    assert change_numbers("no numbers here") is None
    assert (
        negate("She isn't coming. He can't swim. Take the bus to work every day.")
        == "She is coming. He can swim. Not take the bus to work every day."
    )


def test_a_judge_that_accepts_everything_is_measured_fully_lenient():
    result = calibrate("rolememo", [load_sample()], accepting_judge(), SETTINGS)
    assert set(result["judges"]) == set(ROLEPLAY_KEYS) and set(result["lenient"]) == set(ROLEPLAY_KEYS)
    for row in result["judges"].values():
        assert (row["false_accept"], row["false_accepts"], row["wrong"]) == (1.0, 12, 12)
        assert (row["false_reject"], row["faithful"], row["errors"]) == (0.0, 6, 0)
    assert result["candidates"] == {
        "gold": 3,
        "paraphrase": 3,
        "entity": 3,
        "number": 3,
        "negation": 3,
        "other-answer": 3,
    }
    assert result["cost"]["calls"] == 18 * 4  # every candidate, four dimensions, counted
    assert result["false_accepts_shown"]


def test_a_judge_that_compares_to_gold_is_measured_about_zero():
    result = calibrate("rolememo", [load_sample()], comparing_judge(_sample_gold()), SETTINGS)
    assert result["lenient"] == []
    for row in result["judges"].values():
        assert row["false_accept"] <= 0.1 and row["false_reject"] <= 0.1 and row["wrong"] == 12


def test_the_answer_judges_of_locomo_and_realmem_are_calibrated_on_their_scale():
    data = load_dataset("locomo", need(LOCOMO))
    settings = SETTINGS.replace(calibration_queries=12)
    lenient = calibrate("locomo", data.items[:1], accepting_judge(), settings)["judges"]["locomo_correctness"]
    assert lenient["false_accept"] == 1.0 and lenient["wrong"] >= 24
    strict = calibrate("locomo", data.items[:1], comparing_judge({}), settings)["judges"]["locomo_correctness"]
    assert strict["false_accept"] <= 0.1 and strict["false_reject"] <= 0.1
    # RealMem's 0-3 answer judge accepts at 2 ("uses the memory"); role-play dimensions compare with the gold answer's score
    judged = [
        (
            {"persona": "p", "query_id": "q", "kind": kind, "faithful": kind == "gold", "answer": kind},
            {"realmem_answer": score},
        )
        for kind, score in (("gold", 1.0), ("entity", 2.0), ("negation", 0.0))
    ]
    row = rates(judged, 0.2)["judges"]["realmem_answer"]
    assert (row["false_accepts"], row["wrong"], row["false_rejects"], row["faithful"]) == (1, 2, 1, 1)


def test_calibrate_judge_writes_its_files_and_needs_a_judge_in_an_eval(tmp_path):
    folder = calibrate_judge("auto", sample_path(), accepting_judge(), settings=SETTINGS, out=tmp_path / "cal")
    saved = json.loads((folder / "calibration.json").read_text())
    assert saved["dataset"] == "rolememo" and saved["lenient"] and "WARNING" in (folder / "calibration.md").read_text()
    with pytest.raises(ConfigurationError, match="--judge"):
        run_eval(
            "rolememo",
            sample_path(),
            "raw-turns",
            out=tmp_path / "run",
            settings=SETTINGS,
            calibrate_judge=True,
            progress=False,
        )


def test_a_resumed_run_keeps_its_calibration_and_counts_its_calls_once(tmp_path):
    settings = SETTINGS.replace(chat_model="fake:memory")
    run = run_eval(
        "rolememo",
        sample_path(),
        "raw-turns",
        out=tmp_path / "run",
        judge="fake:memory",
        settings=settings,
        calibrate_judge=True,
        progress=False,
        ragas=False,
    )
    first = json.loads((run / "summary.json").read_text())["judge_calibration"]
    assert first["cost"]["calls"] == 18 * 4 and json.loads((run / "run.json").read_text())["calibrate_judge"]
    resume_eval(run, progress=False)
    again = json.loads((run / "summary.json").read_text())["judge_calibration"]
    assert again == first  # read back from the run record: no verdict asked twice, its calls counted once


def _turn_log(name: str, item: Any, ctx: Any) -> TurnLogFramework:
    return TurnLogFramework(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical")


def _report_run(tmp_path: Any, name: str, judge: FakeChatModel) -> Any:
    return run_eval(
        "rolememo",
        sample_path(),
        "turn-log",
        out=tmp_path / name,
        judge=judge,
        settings=SETTINGS,
        framework_factory=_turn_log,
        progress=False,
        ragas=False,
        calibrate_judge=True,
    )


CELLS: Callable[[str], str] = lambda header: (  # noqa: E731 - the cells of the column ``header`` of the table that has it
    "(() => { const t = [...document.querySelectorAll('table')].find(t => [...t.querySelectorAll('th')]"
    f".some(h => h.textContent === {json.dumps(header)})); if (!t) return null;"
    f" const i = [...t.querySelectorAll('th')].findIndex(h => h.textContent === {json.dumps(header)});"
    " return [...t.querySelectorAll('tr')].slice(1).map(r => r.children[i].textContent); })()"
)


def test_the_report_shows_each_judges_leniency_beside_its_scores_in_chromium(tmp_path):
    lenient = _report_run(tmp_path, "lenient", accepting_judge())
    strict = _report_run(tmp_path, "strict", comparing_judge(_sample_gold()))
    with Browser() as page:
        page.open((lenient / "report.html").as_uri())
        assert page.eval(CELLS("false-accept (wrong)")) == ["1.000 (12/12)"] * 4
        assert page.eval(CELLS("mean")) == ["5.000"] * 4  # the judged scores the leniency stands beside
        body = page.eval("document.body.innerText")
        assert body.count("WARNING: judge") == 4 and "accepted 100% of deliberately wrong answers" in body
        assert "Judge calibration" in body and "Quality versus tokens" in body
        assert (
            page.eval("[...document.images].filter(i => i.alt === 'quality_vs_tokens' && i.naturalWidth > 100).length")
            == 1
        )
        page.open((strict / "report.html").as_uri())
        assert page.eval(CELLS("false-accept (wrong)")) == ["0.000 (0/12)"] * 4
        assert page.eval(CELLS("false-reject (faithful)")) == ["0.000 (0/6)"] * 4
        assert "WARNING: judge" not in page.eval("document.body.innerText")
        assert page.exceptions == []
