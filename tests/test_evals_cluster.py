"""`dualmem eval` on a real multi-node Ray cluster on this machine (a head and two worker nodes), the stores and the run
record on a local S3-compatible server (moto), every model the loopback stand-in endpoint: the same records as
in-process, a worker node removed mid-run, a driver killed and resumed from another, the endpoint's limit held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from fixtures.standin import OpenAIStandin

from dualmem.config import ENV_ALIASES, Settings
from dualmem.datasets import dump_rolememo, load_sample
from dualmem.evals.record import RunRecord, record_uri
from dualmem.evals.reports import read_records
from dualmem.evals.runspec import read_run
from dualmem.evaluate import run_evals
from dualmem.schema import Dataset

ray = pytest.importorskip("ray", reason="the Ray runner's tests need ray (pyproject dev extra)")
from ray.cluster_utils import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PERSONAS = ("ana", "ben", "cleo", "dev")
FRAMEWORKS = ["dualmem", "raw-turns"]
STABLE = ("query_id", "persona", "answer", "metrics", "judges", "errors")
TIMING = ("seconds",)


@pytest.fixture(scope="module")
def cluster():
    """A head (the driver's node, no CPU for workers) and two worker nodes of one CPU each; node loss noticed in ~2 s."""
    config = {"health_check_period_ms": 500, "health_check_failure_threshold": 4, "health_check_initial_delay_ms": 0}
    made = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": config}
    )
    workers = [made.add_node(num_cpus=1) for _ in range(2)]
    made.wait_for_nodes()
    made.workers = workers  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        if ray.is_initialized():
            ray.shutdown()
        made.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = load_sample()
    items = []
    for name in PERSONAS:
        item = base.model_copy(deep=True)
        item.dialogue.id = name
        assert item.dialogue.persona is not None
        item.dialogue.persona.id = name  # a persona of its own: ingest writes each history into its own namespace
        items.append(item)
    return dump_rolememo(Dataset(name="rolememo", items=items), tmp_path_factory.mktemp("data") / "rolememo")


# How long the endpoint takes to answer: long enough that four units' calls overlap (more than 2 at once) even on a
# loaded two-core machine, where the harness's own work between calls is tens of milliseconds.
CALL_S = 0.25


def _settings(s3, base_url: str, **more: object) -> Settings:
    store = f"s3://{s3['bucket']}/{uuid.uuid4().hex[:8]}"
    return Settings(
        chat_model="openai-compatible:standin",
        openai_base_url=base_url,
        openai_api_key="x",
        embedder="hash:64",
        store_uri=store,
        store_options=s3["options_json"],
        judge_repetitions=1,
        concurrency=4,
        lease_ttl_s=2.0,
        retry_backoff=0.1,
        **more,
    )  # type: ignore[arg-type]


def _stable(records: list[dict]) -> list[dict]:
    return sorted(({k: r[k] for k in STABLE} for r in records), key=lambda r: (r["persona"], r["query_id"]))


def _summary(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("meta")
    summary["ingest"] = {k: v for k, v in summary["ingest"].items() if k not in TIMING}
    summary["cost"] = _untimed(summary["cost"])  # the same calls and tokens, wherever the units ran
    return summary


def _untimed(value: object) -> object:
    return {k: _untimed(v) for k, v in value.items() if k != "seconds"} if isinstance(value, dict) else value


def _peak(calls: list[dict]) -> int:
    """Return the most calls the endpoint was answering at once."""
    edges = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def _evaluate(data: Path, out: Path, settings: Settings) -> list[Path]:
    return run_evals(
        "rolememo",
        data,
        FRAMEWORKS,
        judge="openai-compatible:standin",
        limit=2,
        out=out,
        settings=settings,
        progress=False,
        ragas=False,
        upload=False,
    )


@pytest.fixture(scope="module")
def in_process(data, s3_server, tmp_path_factory):
    """The run every cluster run is compared with: in process (threads), once for the module; returns its run
    folders, settings and the endpoint's calls."""
    with OpenAIStandin(latency_s=CALL_S) as local:
        settings = _settings(s3_server, local.base_url)
        dirs = _evaluate(data, tmp_path_factory.mktemp("in-process"), settings)
    return {"dirs": dirs, "settings": settings, "calls": list(local.calls)}


def test_a_cluster_run_gives_the_records_of_an_in_process_run_and_holds_the_endpoint_limit(
    cluster, data, s3_server, in_process, tmp_path
):
    here, local_calls = in_process["dirs"], in_process["calls"]
    with OpenAIStandin(latency_s=CALL_S) as remote:
        there = _evaluate(
            data,
            tmp_path / "ray",
            _settings(s3_server, remote.base_url, ray_address=cluster.address, endpoint_concurrency=2),
        )
    assert [p.name for p in there] == FRAMEWORKS
    for a, b in zip(here, there, strict=True):
        assert _stable(read_records(a / "records.jsonl")) == _stable(read_records(b / "records.jsonl"))
        assert _summary(a) == _summary(b)
        assert "Ray cluster" in json.loads((b / "summary.json").read_text())["meta"]["workers"]
    assert len(remote.calls) == len(local_calls)  # no call made twice, none left out
    assert _peak(remote.calls) == 2 < _peak(local_calls)  # 4 units in flight, 2 calls at once across both nodes
    assert not ray.is_initialized()  # the run's connection ended with it
    deadline = time.monotonic() + 15
    while _worker_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _worker_pids(), "a worker outlived its run"


def _memory_counts(settings: Settings, persona: str) -> tuple[int, int, list[str]]:
    """Return (ledger rows, distinct applied chunks, memory item ids) of a persona's dualmem store on S3."""
    from dualmem.stores._lance import connect, query_rows

    db = connect(f"{settings.store_uri}/{persona}", json.loads(settings.store_options))
    ledger = query_rows(db.open_table("chunk_ledger"), None, ["chunk_id", "state"])
    items = query_rows(db.open_table("memory"), None, ["id"])
    return len(ledger), len({r["chunk_id"] for r in ledger if r["state"] == "applied"}), [r["id"] for r in items]


def _worker_pids() -> list[int]:
    """Return the pids of the runs' worker processes on this machine (Ray titles them ``ray::UnitWorker…``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not a process
            continue
        if proc.name.isdigit() and title.startswith("ray::UnitWorker"):
            pids.append(int(proc.name))
    return pids


def _kill_a_worker_process() -> None:
    """SIGKILL one of the run's worker processes."""
    pids = _worker_pids()
    assert pids, "no worker process of the run found"
    os.kill(pids[0], signal.SIGKILL)


@pytest.mark.parametrize("fault", ["node removed", "process killed"])
def test_a_worker_lost_mid_run_applies_each_chunk_once_and_scores_each_query_once(
    fault, cluster, data, s3_server, in_process, tmp_path
):
    reference = in_process["settings"]
    with OpenAIStandin(latency_s=0.3) as server:
        settings = _settings(s3_server, server.base_url, ray_address=cluster.address)
        outcome: dict[str, object] = {}
        runner = threading.Thread(target=lambda: outcome.update(dirs=_evaluate(data, tmp_path / "run", settings)))
        runner.start()
        deadline = time.monotonic() + 120
        while len(server.calls) < 12 and time.monotonic() < deadline:
            time.sleep(0.1)
        if fault == "node removed":
            cluster.remove_node(cluster.workers[0])  # its worker process and raylet die with units in flight
        else:
            _kill_a_worker_process()
        runner.join(timeout=300)
        if fault == "node removed":
            cluster.workers[0] = cluster.add_node(num_cpus=1)  # for the tests after this one
    assert "dirs" in outcome, "the run did not complete after losing a node"
    dirs = outcome["dirs"]
    assert isinstance(dirs, list)
    meta = json.loads((dirs[0] / "summary.json").read_text())["meta"]
    assert "1 lost" in meta["workers"], meta["workers"]
    for fw_dir, ref_dir in zip(dirs, in_process["dirs"], strict=True):
        records = read_records(fw_dir / "records.jsonl")
        assert _stable(records) == _stable(read_records(ref_dir / "records.jsonl"))  # each query once, as the clean run
        run = read_run(fw_dir)
        record = RunRecord(record_uri(settings.store_uri, run["fingerprint"]), settings.store_options)
        for persona in PERSONAS:
            steps = record.steps(fw_dir.name, persona)
            assert steps.count("record") == 2 and steps.count("ingest") == 4  # scored and ingested once each
    for persona in PERSONAS:
        rows, applied, ids = _memory_counts(settings, persona)
        clean_rows, clean_applied, clean_ids = _memory_counts(reference, persona)
        assert rows == applied == clean_applied  # one ledger row per chunk, each applied
        assert len(ids) == len(set(ids)) == len(clean_ids)  # no chunk's items written twice


def _cli(data: Path, out: Path, base_url: str, settings: Settings, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "x",
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_STORE_OPTIONS": settings.store_options,
        "DUALMEM_LEASE_TTL_S": "2",
        "DUALMEM_CONCURRENCY": "4",
        "DUALMEM_JUDGE_REPETITIONS": "1",
        "PYTHONPATH": str(REPO),
        "LANGSMITH_API_KEY": "",
        "LANGCHAIN_API_KEY": "",
    }
    cmd = [sys.executable, "-m", "dualmem.cli", "eval", *extra, "--out", str(out), "--ray", settings.ray_address]
    if not extra:
        cmd[4:4] = [
            str(data),
            "-d",
            "rolememo",
            "-f",
            "dualmem",
            "--limit",
            "2",
            "--model",
            "openai-compatible:standin",
            "--judge",
            "openai-compatible:standin",
            "--store",
            settings.store_uri,
        ]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str]) -> str:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    return output


def test_a_killed_driver_takes_its_workers_with_it_and_resume_from_a_new_driver_repeats_no_call(
    cluster, data, s3_server, tmp_path
):
    with OpenAIStandin(latency_s=0.0) as clean:
        _finish(
            _cli(
                data,
                tmp_path / "clean",
                clean.base_url,
                _settings(s3_server, clean.base_url, ray_address=cluster.address),
            )
        )
    total = len(clean.calls)
    settings = _settings(s3_server, "", ray_address=cluster.address)
    with OpenAIStandin(latency_s=0.0, hold_at=total // 2 + 1) as first:
        proc = _cli(data, tmp_path / "run", first.base_url, settings)
        assert first.wait_held(timeout=240), "the run never reached the call where it is killed"
        time.sleep(2.0)  # every unit in flight is waiting in a held call now
        proc.send_signal(signal.SIGKILL)  # the driver only: Ray must end the job's workers
        proc.wait(timeout=30)
        time.sleep(5.0)
        first.abandon()  # held calls now fail: a surviving worker would retry them
        received = first.received
        time.sleep(3.0)
        assert first.received == received, "a worker of the killed driver kept calling the model"
    answered_before = len(first.calls)
    assert not (tmp_path / "run" / "summary.json").exists()
    with OpenAIStandin(latency_s=0.0) as second:
        output = _finish(_cli(data, tmp_path / "run", second.base_url, settings, "--resume", str(tmp_path / "run")))
    assert "resuming run" in output or answered_before == 0
    assert answered_before + len(second.calls) == total  # no model call made twice across the two drivers
    assert _stable(read_records(tmp_path / "run" / "records.jsonl")) == _stable(
        read_records(tmp_path / "clean" / "records.jsonl")
    )


@pytest.mark.parametrize(
    ("address", "says"), [("nonsense", "is not a Ray address"), ("127.0.0.1:1", "no Ray cluster answers at")]
)
def test_a_bad_or_unreachable_address_is_one_line_and_exit_2(address, says, data, tmp_path):
    from typer.testing import CliRunner

    from dualmem.cli import app

    started = time.monotonic()
    result = CliRunner().invoke(
        app, ["eval", str(data), "--ray", address, "--out", str(tmp_path / "run"), "--model", "fake:memory"]
    )
    assert result.exit_code == 2 and says in result.output and "--ray auto" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and time.monotonic() - started < 20
    assert not (tmp_path / "run").exists()  # nothing was done


def test_batch_ingest_on_the_cluster_writes_what_an_in_process_ingest_writes(cluster, data, s3_server, monkeypatch):
    """In-process through the Python API; on the cluster through `dualmem ingest DIR --ray ADDRESS`, as a user runs it."""
    from typer.testing import CliRunner

    from dualmem.cli import app
    from dualmem.datasets import load_dataset
    from dualmem.evals.ingest import ingest_histories, plan_histories

    texts = {}
    for mode in ("threads", "ray"):
        with OpenAIStandin(latency_s=0.05) as server:
            settings = _settings(s3_server, server.base_url)
            histories = plan_histories(load_dataset("rolememo", data), settings, sessions=2)
            if mode == "threads":
                seen: list[str] = []
                reports = ingest_histories(
                    histories, settings, progress=False, on_report=lambda _r, h, seen=seen: seen.append(h.label)
                )
                assert seen == [f"{p} / {histories[0].namespace[1]}" for p in PERSONAS] and not any(
                    r.failed_chunks for r in reports
                )
            else:
                for name in (
                    "chat_model",
                    "openai_base_url",
                    "openai_api_key",
                    "embedder",
                    "store_options",
                    "concurrency",
                ):
                    monkeypatch.setenv(ENV_ALIASES.get(name, f"DUALMEM_{name.upper()}"), str(settings.flat()[name]))
                result = CliRunner().invoke(
                    app,
                    ["ingest", str(data), "--sessions", "2", "--store", settings.store_uri, "--ray", cluster.address],
                )
                assert result.exit_code == 0, result.output
                asks = [line for line in result.output.splitlines() if line.startswith("ask: dualmem ask")]
                assert [a.split("--persona ")[1].split()[0] for a in asks] == list(PERSONAS), result.output  # in order
        texts[mode] = {p: sorted(_memory_texts(settings, (p, histories[0].namespace[1]))) for p in PERSONAS}
    assert texts["ray"] == texts["threads"] and all(texts["ray"].values())
    assert not ray.is_initialized()


def _memory_texts(settings: Settings, namespace: tuple[str, str]) -> list[str]:
    from dualmem.stores._lance import connect, query_rows
    from dualmem.stores._sql import ns_key

    db = connect(settings.store_uri, json.loads(settings.store_options))
    return [
        r["text"]
        for r in query_rows(db.open_table("memory"), None, ["text", "namespace"])
        if r["namespace"] == ns_key(namespace)
    ]
