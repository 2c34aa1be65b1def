"""benchmarks/frameworks_local.py bookkeeping: skip finished runs, resume interrupted ones, record failures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("frameworks_local", REPO / "benchmarks" / "frameworks_local.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_eval(monkeypatch: pytest.MonkeyPatch, bench, script: str) -> None:
    """Stand in for `dualmem eval ... --out DIR`: run ``script`` with the --out folder as argv[1]."""

    def fake() -> list[str]:
        return [
            sys.executable,
            "-c",
            f"import sys, json, pathlib\nout = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n{script}",
        ]

    monkeypatch.setattr(bench, "_dualmem", fake)


WRITE_RUN = """
out.mkdir(parents=True, exist_ok=True)
(out / 'records.jsonl').write_text(json.dumps({'answer': 'hi'}) + '\\n' + json.dumps({'answer': ' '}) + '\\n')
(out / 'summary.json').write_text(json.dumps({'n_query_errors': 0, 'ingest': {'sessions': 3, 'items_written': 7, 'failed_chunks': 1},
                                              'overall': {'recall_any@10': 0.5, 'recall_any@5': 0.25, 'note': 'x'}}))
print('done')
"""


def test_run_one_records_status_and_skips_finished(bench, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_eval(monkeypatch, bench, WRITE_RUN)
    row = bench.run_one("raw-turns", tmp_path / "data.json", 2, tmp_path, "openai:gpt-x", timeout=60)
    assert row["status"] == "ok" and row["exit"] == 0 and row["engine"] == "openai"
    assert row["queries"] == 2 and row["answered"] == 1
    assert row["metrics"] == {"recall_any@10": 0.5}
    assert row["ingest"]["items_written"] == 7
    assert json.loads((tmp_path / "raw-turns.status.json").read_text())["wall_s"] == row["wall_s"]
    # a finished run is not run again: a failing command would show
    _fake_eval(monkeypatch, bench, "raise SystemExit(3)")
    again = bench.run_one("raw-turns", tmp_path / "data.json", 2, tmp_path, "openai:gpt-x", timeout=60)
    assert again["status"] == "ok" and again["wall_s"] == row["wall_s"]


def test_interrupted_run_adds_its_time_to_the_resumed_one(
    bench, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "amem.status.json").write_text(
        json.dumps({"framework": "amem", "status": "interrupted", "wall_s": 100.0, "segments": 2})
    )
    # the resumed segment lasts long enough to show in wall_s, which is rounded to 0.1 s
    _fake_eval(monkeypatch, bench, "import time\ntime.sleep(0.3)\n" + WRITE_RUN)
    row = bench.run_one("amem", tmp_path / "data.json", 2, tmp_path, "openai:gpt-x", timeout=60)
    assert row["status"] == "ok" and row["segments"] == 3
    assert 100.0 < row["wall_s"] < 200.0


def test_failed_run_keeps_log_tail_and_its_time_is_not_carried(
    bench, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "amem.status.json").write_text(json.dumps({"framework": "amem", "status": "failed", "wall_s": 100.0}))
    _fake_eval(monkeypatch, bench, "print('model exploded'); raise SystemExit(2)")
    row = bench.run_one("amem", tmp_path / "data.json", 2, tmp_path, "openai:gpt-x", timeout=60)
    assert row["status"] == "failed" and row["exit"] == 2
    assert "model exploded" in row["log_tail"]
    assert row["wall_s"] < 100.0 and row["segments"] == 1


def test_markdown_table_has_one_row_per_framework(bench) -> None:
    rows = [
        {
            "framework": "a",
            "status": "ok",
            "engine": "llama.cpp",
            "wall_s": 600.0,
            "queries": 2,
            "answered": 2,
            "ingest": {"sessions": 3, "items_written": 5, "failed_chunks": 0},
            "metrics": {"recall_any@10": 0.5},
        },
        {"framework": "b", "status": "interrupted", "wall_s": 60.0},
    ]
    lines = bench.markdown_table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| `a` | ok | llama.cpp | 10 min | 3 | 5 | 0 | 2/2 | 0.5 |"
    assert lines[3].startswith("| `b` | interrupted | - | 1 min |")


def test_report_only_starts_nothing_and_keeps_the_other_frameworks_rows(
    bench, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = tmp_path / "Sophie.json"
    data.write_text("{}")
    out = tmp_path / "results.json"
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "amem.status.json").write_text(json.dumps({"framework": "amem", "status": "interrupted", "wall_s": 120.0}))
    common = ["--data", str(data), "--runs", str(runs), "--out", str(out), "--model", "openai:gpt-x"]
    _fake_eval(monkeypatch, bench, WRITE_RUN)
    bench.main([*common, "--frameworks", "raw-turns"])
    _fake_eval(monkeypatch, bench, "raise SystemExit('must not run')")
    (runs / "memagent").mkdir()  # started, no status yet
    results = bench.main([*common, "--frameworks", "amem,langmem,memagent", "--report"])
    rows = {r["framework"]: r for r in results["frameworks"]}
    assert rows["raw-turns"]["status"] == "ok" and rows["raw-turns"]["queries"] == 2  # kept from the first call
    assert rows["amem"] == {"framework": "amem", "status": "interrupted", "wall_s": 120.0}
    assert rows["langmem"]["status"] == "not run" and not (runs / "langmem").exists()
    assert rows["memagent"]["status"].startswith("incomplete")
    assert [r["framework"] for r in results["frameworks"]] == [n for n in bench.REGISTRY if n in rows]  # registry order
    assert json.loads(out.read_text())["frameworks"] == results["frameworks"]
    # another limit is another benchmark: its rows are not mixed in
    other = bench.main([*common, "--frameworks", "langmem", "--report", "--limit", "5"])
    assert [r["framework"] for r in other["frameworks"]] == ["langmem"]


def test_an_interrupt_records_the_run_and_exits_130(bench, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = tmp_path / "Sophie.json"
    data.write_text("{}")
    runs, out = tmp_path / "runs", tmp_path / "results.json"

    def interrupted(name, data, limit, runs, model, timeout, *, run=True):
        if not run:
            return {"framework": name, "status": "interrupted", "wall_s": 5.0}
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_one", interrupted)
    with pytest.raises(SystemExit) as stop:
        bench.main(["--data", str(data), "--runs", str(runs), "--out", str(out), "--frameworks", "amem,langmem"])
    assert stop.value.code == 130
    rows = json.loads(out.read_text())["frameworks"]
    assert rows == [{"framework": "amem", "status": "interrupted", "wall_s": 5.0}]  # langmem was never started
