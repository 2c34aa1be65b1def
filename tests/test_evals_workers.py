"""Personas evaluated in worker processes: same records as threads, progress reaches the bars, a killed run's workers end
with it and the run resumes without repeating a model call (real dualmem framework, LanceDB on disk, HTTP stand-in)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SHARED_DATA, need
from fixtures.eval_cli import REPO, eval_cli, finish
from fixtures.standin import OpenAIStandin

from dualmem.config import Settings
from dualmem.datasets import dump_realmem, load_realmem
from dualmem.errors import ConfigurationError
from dualmem.evals.journal import JOURNAL, Journal
from dualmem.evals.reports import read_records
from dualmem.evals.run import run_eval
from dualmem.evals.workers import workers_for
from dualmem.testing import HashEmbeddings

STABLE = ("query_id", "persona", "answer", "metrics", "judges", "errors")
PERSONAS = ("Sophie_Dubois", "Oliver_Smith")  # both ask queries within their first 6 sessions


def _stable(records: list[dict]) -> list[dict]:
    return sorted(({k: r[k] for k in STABLE} for r in records), key=lambda r: (r["persona"], r["query_id"]))


@pytest.fixture
def two_personas(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    for name in PERSONAS:
        item = load_realmem(need(SHARED_DATA / "realmem" / f"{name}_dialogues_256k.json"), limit_sessions=6).items[0]
        dump_realmem(item, path=folder / f"{name}_dialogues_test.json")
    return folder


def _settings(base_url: str, out: Path, **more: object) -> Settings:
    return Settings(chat_model="openai-compatible:standin", openai_base_url=base_url, openai_api_key="x", embedder="hash:64",
                    store_uri=str(out / "lancedb"), checkpoint_path=str(out / "ck.sqlite"), **more)  # type: ignore[arg-type]


def test_workers_give_the_records_threads_give_and_report_progress(two_personas, tmp_path, capsys):
    runs = {}
    for mode, workers in (("threads", 1), ("processes", 0)):
        out = tmp_path / mode
        with OpenAIStandin(latency_s=0.0) as server:
            run_dir = run_eval("realmem", two_personas, "dualmem", judge="openai-compatible:standin", limit=2, out=out,
                               settings=_settings(server.base_url, out, concurrency=2, eval_workers=workers), upload=False, ragas=False)
        summary = json.loads((run_dir / "summary.json").read_text())
        runs[mode] = (read_records(run_dir / "records.jsonl"), len(server.calls), summary["meta"]["workers"], capsys.readouterr().err)
    (rec_t, calls_t, meta_t, _), (rec_p, calls_p, meta_p, err_p) = runs["threads"], runs["processes"]
    assert meta_t == "threads of one process" and meta_p == "2 processes"
    assert len(rec_p) == 4 and _stable(rec_p) == _stable(rec_t) and calls_p == calls_t
    assert all(r["judges"] for r in rec_p)  # judged in the evaluating process after the worker's branch
    assert "queries: 4/4" in err_p and "answers judged: 4/4" in err_p  # workers' progress reached the bars


def test_workers_do_not_run_the_evaluating_script_again(two_personas, tmp_path):
    """The forkserver imports the evaluating script once; workers forked from it find it loaded (without that, each
    worker ran the script and all it imports again: the CLI's plots and matplotlib, about 1 CPU-s per worker)."""
    marks, script = tmp_path / "imports.txt", tmp_path / "evaluate.py"
    script.write_text(f"with open({str(marks)!r}, 'a') as fh:\n    fh.write(__name__ + '\\n')\n"
                      "if __name__ == '__main__':\n    from dualmem.cli import app\n\n    app()\n")
    with OpenAIStandin(latency_s=0.0) as server:
        output = finish(eval_cli(two_personas, tmp_path / "run", server.base_url, limit=2, script=script,
                                 env={"DUALMEM_CONCURRENCY": "2"}))
    assert "2 processes" in json.loads((tmp_path / "run" / "summary.json").read_text())["meta"]["workers"], output[-2000:]
    assert marks.read_text().split() == ["__main__", "__mp_main__"], "the script ran in the CLI process and the forkserver only"


PRIORITY_CHECK = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from dualmem.evals.workers import _lower_priority
gate = threading.Event()
side = threading.Thread(target=gate.wait)
side.start()
nice = lambda: sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")})
want = max(7, os.getpriority(os.PRIO_PROCESS, 0))  # a test run that is niced already stays so
_lower_priority(7)
after = nice()
_lower_priority(3)
print(after == nice() == [want])
gate.set()
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread priorities are read from Linux's /proc")
def test_a_smaller_personas_worker_yields_the_cpu_to_the_critical_path_with_all_its_threads():
    from dualmem.evals.workers import priorities

    assert priorities({"Ethan": 45.0, "Kenta": 24.0, "Sophie": 27.0}) == {"Ethan": 0, "Kenta": 7, "Sophie": 6}
    done = subprocess.run([sys.executable, "-c", PRIORITY_CHECK, str(REPO)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", "every thread got nice 7, and a later, smaller value never lowered it"


def test_how_many_workers():
    auto = Settings(concurrency=4)
    assert workers_for(auto, 9, objects=False) == 4
    assert workers_for(auto, 2, objects=False) == 2
    assert workers_for(auto, 1, objects=False) == 0  # one persona: no pool to start
    assert workers_for(auto, 9, objects=True) == 0  # objects stay in this process: threads
    assert workers_for(Settings(concurrency=4, eval_workers=1), 9, objects=False) == 0
    assert workers_for(Settings(concurrency=1), 9, objects=False) == 0
    assert workers_for(Settings(concurrency=8, eval_workers=3), 9, objects=False) == 3
    with pytest.raises(ConfigurationError, match="eval_workers=3 .* set eval_workers=1"):
        workers_for(Settings(concurrency=8, eval_workers=3), 9, objects=True)


def test_objects_given_to_run_eval_keep_the_run_in_threads(two_personas, tmp_path):
    with OpenAIStandin(latency_s=0.0) as server:
        run_dir = run_eval("realmem", two_personas, "dualmem", limit=1, out=tmp_path / "run", respond=False, ragas=False,
                           settings=_settings(server.base_url, tmp_path, concurrency=2), embeddings=HashEmbeddings(64), progress=False)
    assert json.loads((run_dir / "summary.json").read_text())["meta"]["workers"] == "threads of one process"


def _cli(data: Path, out: Path, base_url: str) -> subprocess.Popen[str]:
    return eval_cli(data, out, base_url, limit=2, env={"DUALMEM_CONCURRENCY": "2", "DUALMEM_RETRY_BACKOFF": "0.2"})



def test_a_killed_run_takes_its_workers_with_it_and_resumes_without_repeating_a_call(two_personas, tmp_path):
    with OpenAIStandin(latency_s=0.0) as clean:
        finish(_cli(two_personas, tmp_path / "clean", clean.base_url))
    total = len(clean.calls)
    assert json.loads((tmp_path / "clean" / "summary.json").read_text())["meta"]["workers"] == "2 processes"

    with OpenAIStandin(latency_s=0.0, hold_at=total // 2 + 1) as first:
        proc = _cli(two_personas, tmp_path / "run", first.base_url)
        assert first.wait_held(timeout=240), "the run never reached the call where it is killed"
        proc.send_signal(signal.SIGKILL)  # the evaluating process only: its workers must notice and end
        proc.wait(timeout=30)
        time.sleep(2.0)
        first.abandon()  # held calls now fail: a surviving worker would retry them
        received = first.received
        time.sleep(3.0)
        assert first.received == received, "a worker of the killed run kept calling the model"
    answered_before = len(first.calls)
    journal = Journal(tmp_path / "run" / JOURNAL)
    assert journal.count("ingest") >= 1 and not (tmp_path / "run" / "summary.json").exists()
    journal.close()

    with OpenAIStandin(latency_s=0.0) as second:
        output = finish(_cli(two_personas, tmp_path / "run", second.base_url))
    assert "resuming run" in output
    assert answered_before + len(second.calls) == total  # no model call answered twice across the two runs
    assert _stable(read_records(tmp_path / "run" / "records.jsonl")) == _stable(read_records(tmp_path / "clean" / "records.jsonl"))


def test_ctrl_c_stops_the_workers_at_once(two_personas, tmp_path):
    with OpenAIStandin(latency_s=0.0, hold_at=6) as server:
        proc = _cli(two_personas, tmp_path / "run", server.base_url)
        assert server.wait_held(timeout=240)
        time.sleep(1.0)  # both personas are in held calls now
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        output, _ = proc.communicate(timeout=60)  # without ending its workers it would wait for held calls forever
        assert proc.returncode != 0 and time.monotonic() - started < 30, output[-2000:]
        assert f"dualmem eval --resume {tmp_path / 'run'}" in output.replace("\n", "")
        server.abandon()
        received = server.received
        time.sleep(2.0)
        assert server.received == received  # no worker outlived the interrupted run
