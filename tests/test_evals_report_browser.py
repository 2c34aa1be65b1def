"""The run report in a real headless Chromium: it renders (tables, figures, every query) and its filters work."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest
from conftest import LOCOMO, need
from fixtures.chromium import Browser

from dualmem.config import Settings
from dualmem.evals.drilldown import query_hit
from dualmem.evals.fakes import TurnLogFramework
from dualmem.evals.reports import read_records
from dualmem.evals.summary import group_label
from dualmem.evaluate import run_eval
from dualmem.frameworks import FrameworkContext
from dualmem.testing import FakeChatModel

VISIBLE = "[...document.querySelectorAll('details.query')].filter(d => d.getBoundingClientRect().height > 0)"


@pytest.fixture(scope="module")
def locomo_run(tmp_path_factory):
    def factory(name, item, ctx):
        return TurnLogFramework(FrameworkContext(namespace=(item.dialogue.id, "u")), ranking="lexical")

    out = tmp_path_factory.mktemp("report") / "run"
    judge = FakeChatModel(
        responses=[lambda m: {"reasoning": "scripted verdict", "score": len(str(m[-1].content)) % 2}], cycle=True
    )
    return run_eval(
        "locomo",
        need(LOCOMO),
        "turn-log",
        out=out,
        personas=["conv-26"],
        limit=16,
        judge=judge,
        settings=Settings(embedder="hash:64"),
        framework_factory=factory,
        progress=False,
        ragas=False,
    )


def _select(page, element_id: str, value: str) -> None:
    page.eval(
        f"var s=document.getElementById({json.dumps(element_id)}); s.value={json.dumps(value)};"
        "s.dispatchEvent(new Event('change'))"
    )


def test_report_renders_in_chromium_and_its_filters_work(locomo_run):
    records = read_records(locomo_run / "records.jsonl")
    n = len(records)
    groups = Counter(group_label(r) for r in records)
    assert set(groups) <= {"multi-hop", "temporal", "open-domain", "single-hop", "adversarial"}  # names, not "1", "2"
    misses = [r["query_id"] for r in records if query_hit(r) is False]
    assert 0 < len(misses) < n  # the run has both hits and misses to filter
    url = (locomo_run / "report.html").as_uri()
    with Browser() as page:
        page.open(url)
        assert page.eval("document.querySelectorAll('details.query').length") == n
        assert (
            page.eval("document.getElementById('q-count').textContent") == f"showing {n} of {n} queries"
        )  # the script ran
        assert page.eval("document.images.length") >= 2
        assert page.eval("[...document.images].every(i => i.complete && i.naturalWidth > 100)")  # figures decode
        assert page.eval("document.querySelectorAll('table').length") >= 3
        assert sorted(
            page.eval("[...document.querySelectorAll('#f-group option')].map(o => o.value).filter(v => v)")
        ) == sorted(groups)

        group, count = min(groups.items(), key=lambda kv: kv[1])
        _select(page, "f-group", group)
        assert page.eval(f"{VISIBLE}.map(d => d.dataset.group)") == [group] * count
        assert page.eval("document.getElementById('q-count').textContent") == f"showing {count} of {n} queries"
        assert f"group={group}" in page.eval("decodeURIComponent(location.hash)")

        _select(page, "f-group", "")
        _select(page, "f-hit", "0")
        shown = page.eval(f"{VISIBLE}.map(d => d.querySelector('summary b').textContent.split(' · ')[1])")
        assert shown == misses

        _select(page, "f-hit", "")
        texts = {
            r["query_id"]: " ".join(
                [
                    r["query"],
                    r.get("answer") or "",
                    str(r.get("reference_answer") or ""),
                    r["persona"],
                    r["query_id"],
                    *r["gold"]["facts"],
                    r["gold"]["insight"] or "",
                    *r["gold"]["memory_points"],
                    *(it["text"] for it in r["retrieved"]),
                ]
            ).lower()
            for r in records
        }
        words = {w.strip("?.,!'\"").lower() for w in records[0]["query"].split() if len(w) > 4}
        word = min(sorted(words), key=lambda w: sum(w in t for t in texts.values()))  # the most selective word
        expected = [q for q, t in texts.items() if word in t]
        page.eval(
            f"var q=document.getElementById('f-text'); q.value={json.dumps(word)}; q.dispatchEvent(new Event('input'))"
        )
        assert 1 <= len(expected) < n
        assert page.eval(f"{VISIBLE}.map(d => d.querySelector('summary b').textContent.split(' · ')[1])") == expected

        page.open(url.split("#")[0] + "#hit=1")  # a filtered view reopened from its link
        assert page.eval(f"{VISIBLE}.length") == n - len(misses) - sum(query_hit(r) is None for r in records)
        assert page.eval("document.getElementById('f-hit').value") == "1"

        page.eval("document.querySelector('details.query').open = true")  # the drill-down of one query
        first = records[0]
        cells = page.eval(
            "[...document.querySelector('details.query table.retrieved').rows].slice(1)"
            ".map(r => [r.cells[1].innerText.trim(), r.cells[3].innerText.trim()])"
        )
        assert [text for _, text in cells] == [it["text"] for it in first["retrieved"]]
        assert [mark.startswith("✓") for mark, _ in cells] == [bool(it["hit"]) for it in first["retrieved"]]
        judges = page.eval(
            "[...document.querySelector('details.query table.judges').rows].slice(1).map(r => r.cells[0].innerText)"
        )
        assert judges == list(first["judges"]) == ["locomo_correctness"]

        import matplotlib.image as mpimg

        image = mpimg.imread(io.BytesIO(page.screenshot()), format="png")
        assert image.shape[0] > 500 and image.std() > 0.05  # something drawn, not a blank page
        assert page.exceptions == []
