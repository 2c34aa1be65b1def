"""A RoleMemo-scale dry run of batch ingest: ``dualmem ingest -d rolememo --ray`` over many personas into S3.

The product's own entry point, as a user runs it: the CLI ``dualmem ingest DIR -d rolememo --ray HOST:PORT --store
s3://rolememo/db`` in a process of its own (the *driver*), over ``--personas`` (default 2,052) synthetic RoleMemo
personas: copies of the bundled sample (four short sessions, ~160 tokens each: one chunk per session), each its own
persona id (``p0000``…) and so its own namespace ``(pNNNN, theo)`` with its own lease row; ``--sessions K`` keeps the
first K sessions. The writer is the instant offline model ``fake:memory`` (one fact and one insight per chunk); the
embedder the bundled one (``--embedder hash:384`` for a cheaper one, recorded). The store is a bucket on moto's
S3-compatible server on a loopback port, whose request log is counted (``--store folder``: a local folder instead,
with no requests to count: moto serves every request from one Python process, which bounds an S3 run of all 2,052
personas to hours on two cores); the cluster a local Ray cluster of a head (no CPU for workers) and two worker
nodes of one CPU each (``ray.cluster_utils.Cluster``, as ``eval_scale.py``).

Measured (nothing typed by hand):

- wall time of the driver; histories, chunks, facts and insights it reports; failed chunks; model calls;
- from the store afterwards: every persona's namespace has exactly its chunks applied, each once (ledger rows per
  unit), its memory rows unduplicated (``pk``), its lease row released; personas registered;
- table commits: each table's ``version`` after the run (the bucket starts empty, so before = 0: the figures include
  creating the tables; versions stay monotonic through the writers' cleanups);
- S3 requests: lines of the server's log, in total, per chunk, by method and by table;
- CPU-seconds: the driver's and the Ray workers' (the harness), Ray's daemons' and the S3 server's apart;
- peak RSS of the driver (``/proc`` VmHWM, polled; and ``RUSAGE_CHILDREN``) and of each Ray worker;
- lease waits: the time each history's writer waited for other writers before it held its namespace (the
  product's ``WriteReport.lease_wait_s``, which ``dualmem ingest`` prints under a history's line from 0.05 s):
  histories that waited, the total and the longest wait. Every persona is its own namespace, written by one task,
  so a writer can wait only on the creation guard of its lease row (``write_leases``, ``slot_of``: shared by
  namespaces of one slot, once, while a row is created); also counted: personas sharing a slot, and the
  ``LeaseTimeout``/"is being written by" lines of the driver's output (a writer that waited ``lease_wait_s`` in
  vain).

Projection (in the results' ``projection`` block, inputs measured here): the RoleMemo corpus of P = 2,052 personas
(``--full-personas``) with histories of L tokens each (L = 32k, 64k, 128k, 256k; ``--history-tokens``), cut into
chunks of at most C = ``chunk_tokens`` (Settings, default 1,024) tokens, assuming full chunks (sessions ending early
make more, smaller chunks)::

    chunks   = P × ceil(L / C)                        (the 256k corpus: 2,052 × 250 = 513,000 chunks)
    wall_s  ≈ max(chunks × calls_per_chunk / T,       (the endpoint's throughput T calls/s, --throughput)
                  chunks × cpu_s_per_chunk / cores,   (the harness's CPU, --cores)
                  chunks × latency_s / concurrency)   (histories in flight: the ``concurrency`` setting, --latency)
    commits  = chunks × commits_per_chunk
    requests = chunks × requests_per_chunk

``calls_per_chunk``, ``cpu_s_per_chunk`` (driver + Ray workers), ``commits_per_chunk`` and ``requests_per_chunk``
are the run's steady state (``measured.steady_state``): the growth of each total (model calls, CPU-s, the tables'
versions, the S3 log) from the report of the first fifth of the histories to the end (and fifth by fifth in
``measured.by_fifth``: whether a chunk costs more as the store grows), over the chunks written
meanwhile, so the start (tables created, personas saved, workers started, the embedder loaded) is left out; the whole
run's figures are ``measured.per_chunk``. The dry run's histories are 1-4 chunks long, so costs paid once per
history (opening the store, creating and releasing its lease row) are spread over few chunks here and over ~250 in
the corpus: the projected commits, requests and CPU are upper bounds (``--sessions 1`` against the default tells the
two apart). The driver holds every history's text while it
runs: ``history_text_gb`` = P × L × 4 bytes (4 characters per token) is a floor on its memory for the corpus.

    python benchmarks/rolememo_dry_run.py      # 2,052 personas; writes benchmarks/results/rolememo_dry_run.json
    python benchmarks/rolememo_dry_run.py --personas 20 --out /tmp/dry.json      # a smoke run
    python benchmarks/rolememo_dry_run.py --store folder      # writes benchmarks/results/rolememo_dry_run_folder.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dualmem.testing.s3 import S3Server

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "rolememo_dry_run.json"
RESULTS_FOLDER = REPO / "benchmarks" / "results" / "rolememo_dry_run_folder.json"  # the default of --store folder
BUCKET = "rolememo"
USER = "theo"  # the bundled sample's user: every namespace is (pNNNN, theo)
TICK = os.sysconf("SC_CLK_TCK")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
REPORT = re.compile(
    r"^(?P<label>\S+ / \S+): (?P<chunks>\d+) chunks, (?P<facts>\d+) facts, (?P<insights>\d+) insights, "
    r"(?P<failed>\d+) failed chunk"
)
CALLS = re.compile(r"^\s+cost: (?P<calls>\d+) model call")
SKIPPED = re.compile(r"^(?P<label>\S+ / \S+): all (?P<chunks>\d+) chunks were written before")
LEASE = re.compile(r"LeaseTimeout|is being written by")
WAITED = re.compile(r"^\s+waited (?P<s>[\d.]+) s for another writer")
ROUTINE = re.compile(r"^(\S+ / \S+: |\s+cost: |\s+waited |ask: dualmem ask |.*histories written)")


def make_data(folder: Path, personas: int) -> Path:
    """Write ``personas`` copies of the bundled RoleMemo sample into ``folder``: dialogue and persona ids p0000…

    (``eval_scale.make_data`` renames the dialogue only: ``dualmem ingest`` would write every copy into the sample
    persona's one namespace.)"""
    from dualmem.datasets import dump_rolememo, load_sample
    from dualmem.schema import Dataset

    base = load_sample()
    items = []
    for i in range(personas):
        item = base.model_copy(deep=True)
        item.dialogue.id = f"p{i:04d}"
        item.dialogue.persona.id = f"p{i:04d}"
        items.append(item)
    return dump_rolememo(Dataset(name="rolememo", items=items), folder)


def _requests_summary(requests: list[dict[str, str]]) -> dict[str, Any]:
    def table(path: str) -> str:
        found = re.search(r"/([^/]+)\.lance(/|$)", path)
        return found.group(1) if found else "(other)"

    return {
        "total": len(requests),
        "by_method": dict(Counter(r["method"] for r in requests).most_common()),
        "by_table": dict(Counter(table(r["path"]) for r in requests).most_common()),
        "errors_5xx": sum(r["status"].startswith("5") for r in requests),
        "status_4xx": sum(r["status"].startswith("4") for r in requests),
    }


def _proc(pid: int) -> tuple[int, str, float, float] | None:
    """Return (parent pid, command line, CPU-s, peak RSS MB) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    hwm = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(fields[1]), cmd, (int(fields[11]) + int(fields[12])) / TICK, int(hwm.group(1)) / 1024 if hwm else 0.0


class Watch:
    """Poll ``/proc`` every ``every`` s for this process's descendants: each one's latest CPU-s and peak RSS."""

    def __init__(self, every: float = 0.5) -> None:
        self.every, self.seen, self.start_cpu = every, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        procs = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (got := _proc(int(entry.name))) is not None:
                procs[int(entry.name)] = got
        mine, frontier = set(), {os.getpid()}
        while frontier:  # descendants of this process (the Ray cluster's daemons and workers, the driver, moto)
            frontier = {pid for pid, p in procs.items() if p[0] in frontier and pid not in mine}
            mine |= frontier
        for pid in mine:
            _, cmd, cpu, hwm = procs[pid]
            old = self.seen.get(pid)
            self.seen[pid] = {
                "cmd": cmd if cmd else (old or {}).get("cmd", ""),
                "cpu_s": cpu,
                "peak_rss_mb": max(hwm, (old or {}).get("peak_rss_mb", 0.0)),
            }

    def begin(self) -> None:
        """Take the CPU-seconds so far as the start, and poll from now on."""
        self.sample()
        self.start_cpu = {pid: p["cpu_s"] for pid, p in self.seen.items()}
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def end(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def used(self, pid: int) -> float:
        """CPU-seconds of ``pid`` since :meth:`begin`."""
        return self.seen[pid]["cpu_s"] - self.start_cpu.get(pid, 0.0)


class Folder:
    """The store in a local folder (``--store folder``): S3Server's interface, with no server and no request log."""

    proc = None

    def __init__(self, folder: Path) -> None:
        self.uri, self.options = str(folder / "db"), dict[str, str]()

    def requests(self) -> list[dict[str, str]]:
        return []

    def close(self) -> None:
        pass


def snapshot(s3: S3Server | Folder, watch: Watch, driver: int, reports: list[dict], calls: int, t: float) -> dict:
    """The running totals at a point of the run (for the steady state's marginal figures)."""
    import dualmem.stores._lance as L

    requests = len(s3.requests())  # before the versions are read
    watch.sample()
    db = L.connect(s3.uri, L.storage_options(s3.options))
    commits = sum(int(db.open_table(name).version) for name in L.table_names(db))
    harness = sum(
        watch.used(pid) for pid, p in watch.seen.items() if pid == driver or p["cmd"].startswith("ray::UnitWorker")
    )
    chunks = sum(r["chunks"] for r in reports if "facts" in r)
    return {
        "t_s": t,
        "histories": len(reports),
        "chunks": chunks,
        "calls": calls,
        "requests": requests,
        "commits": commits,
        "harness_cpu_s": harness,
    }


def check_store(uri: str, options: dict[str, str], data: Path, sessions: int | None) -> dict[str, Any]:
    """Read the store back: tables' versions, every namespace's applied chunks (once each), memory rows, lease rows."""
    import pyarrow.compute as pc

    import dualmem.stores._lance as L
    from dualmem.config import Settings
    from dualmem.datasets import load_dataset
    from dualmem.memory.chunking import chunk_sessions
    from dualmem.stores._sql import ns_key
    from dualmem.stores.leases import slot_of

    db = L.connect(uri, L.storage_options(options))
    versions = {name: int(db.open_table(name).version) for name in sorted(L.table_names(db))}
    chunk_tokens = Settings().tuning.chunk_tokens
    expected: dict[str, set[str]] = {}
    slots: Counter[int] = Counter()
    for item in load_dataset("rolememo", data).items:
        ns = (item.dialogue.persona.id, item.dialogue.user_id or USER)
        got = item.dialogue.sessions[:sessions] if sessions else item.dialogue.sessions
        expected[ns_key(ns)] = {c["id"] for c in chunk_sessions(got, ns, chunk_tokens)}
        slots[slot_of(ns)] += 1
    ledger = db.open_table("chunk_ledger").to_arrow().select(["id", "namespace", "chunk_id", "state"]).to_pylist()
    per_unit = Counter(r["id"] for r in ledger)
    applied: dict[str, list[str]] = {}
    for r in ledger:
        if (r["state"] or "applied") == "applied":
            applied.setdefault(r["namespace"], []).append(r["chunk_id"])
    wrong = sorted(ns for ns in expected if sorted(applied.get(ns, [])) != sorted(expected[ns]))
    memory = db.open_table("memory").to_arrow().select(["pk", "namespace", "kind", "status"])
    pks = Counter(memory.column("pk").to_pylist())
    kinds = Counter(memory.column("kind").to_pylist())
    leases = db.open_table("namespace_leases").to_arrow().to_pylist()
    lease_rows = Counter(r["namespace"] for r in leases)
    personas = db.open_table("personas").to_arrow().column("id").to_pylist() if "personas" in versions else []
    return {
        "table_versions": versions,
        "personas_expected": len(expected),
        "personas_registered": len(set(personas)),
        "persona_rows_duplicated": len(personas) - len(set(personas)),
        "chunks_expected": sum(len(v) for v in expected.values()),
        "chunks_applied": sum(len(v) for v in applied.values()),
        "namespaces_not_exactly_applied": len(wrong),
        "namespaces_not_exactly_applied_first": wrong[:5],
        "ledger_rows": len(ledger),
        "ledger_units_duplicated": sum(n - 1 for n in per_unit.values() if n > 1),
        "ledger_pending": sum(1 for r in ledger if r["state"] == "pending"),
        "memory_rows": memory.num_rows,
        "memory_rows_by_kind": dict(kinds),
        "memory_active": int(pc.sum(pc.equal(memory.column("status"), "active")).as_py() or 0),
        "memory_pk_duplicated": sum(n - 1 for n in pks.values() if n > 1),
        "lease_rows": len(leases),
        "lease_rows_duplicated": sum(n - 1 for n in lease_rows.values() if n > 1),
        "lease_rows_still_held": sum(1 for r in leases if r["holder"]),
        "namespaces_without_lease_row": len(set(expected) - set(lease_rows)),
        "namespaces_sharing_a_creation_slot": sum(n for n in slots.values() if n > 1),
    }


def projection(measured: dict[str, Any], args: argparse.Namespace, chunk_tokens: int, concurrency: int) -> dict:
    """Project the full corpus from this run's per-chunk figures (the formula of the module docstring)."""
    source = "steady_state" if measured["steady_state"] else "whole run"
    per = (measured["steady_state"] or measured)["per_chunk"]
    tiers = []
    for tokens in (int(t) for t in args.history_tokens.split(",")):
        chunks = args.full_personas * math.ceil(tokens / chunk_tokens)
        bounds = {
            "endpoint_s": chunks * per["model_calls"] / args.throughput,
            "harness_cpu_s": chunks * per["harness_cpu_s"] / args.cores,
            "in_flight_s": chunks * args.latency / concurrency,
        }
        wall = max(bounds.values())
        tiers.append(
            {
                "history_tokens": tokens,
                "chunks": chunks,
                "model_calls": round(chunks * per["model_calls"]),
                "wall_h": round(wall / 3600, 2),
                "bound_by": max(bounds, key=lambda k: bounds[k]),
                "bounds_h": {k: round(v / 3600, 2) for k, v in bounds.items()},
                "commits": round(chunks * per["commits"]),
                "requests": None if per["requests"] is None else round(chunks * per["requests"]),
                "history_text_gb": round(args.full_personas * tokens * 4 / 1e9, 2),
            }
        )
    return {
        "formula": "chunks = P * ceil(L / C); wall_s ~ max(chunks * calls_per_chunk / T, chunks * cpu_s_per_chunk / "
        "cores, chunks * latency_s / concurrency); commits = chunks * commits_per_chunk; requests = chunks * "
        "requests_per_chunk; history_text_gb = P * L * 4 bytes / 1e9 (a floor on the driver's memory)",
        "assumptions": "full chunks of C tokens (sessions ending early make more chunks); per-chunk figures from "
        "this dry run, whose 1-4-chunk histories spread per-persona costs over few chunks: commits, requests and "
        "CPU are upper bounds; in-flight histories = the concurrency setting (cluster-wide)",
        "inputs": {
            "per_chunk_from": source,
            "P": args.full_personas,
            "C": chunk_tokens,
            "T_calls_per_s": args.throughput,
            "cores": args.cores,
            "latency_s": args.latency,
            "concurrency": concurrency,
            "calls_per_chunk": per["model_calls"],
            "cpu_s_per_chunk": per["harness_cpu_s"],
            "commits_per_chunk": per["commits"],
            "requests_per_chunk": per["requests"],
        },
        "tiers": tiers,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--personas", type=int, default=2052)
    parser.add_argument("--sessions", type=int, default=None, help="first K sessions of each history (default: all 4)")
    parser.add_argument("--embedder", default="", help="embedder spec (default: the product's, the bundled one)")
    parser.add_argument("--concurrency", type=int, default=None, help="histories in flight (default: the setting's)")
    parser.add_argument("--throughput", type=float, default=10.0, help="projection: endpoint calls/s")
    parser.add_argument("--latency", type=float, default=2.0, help="projection: seconds per model call")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="projection: harness cores")
    parser.add_argument("--full-personas", type=int, default=2052, help="projection: personas of the corpus")
    parser.add_argument("--history-tokens", default="32000,64000,128000,256000", help="projection: tokens/history")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--every", type=int, default=0, help="print a progress line every N histories")
    parser.add_argument(
        "--store",
        choices=("s3", "folder"),
        default="s3",
        help="s3: a bucket on moto's server, its requests counted; folder: a local folder (no requests to count)",
    )
    parser.add_argument("--out", type=Path, default=None, help="results file (default: by --store, in results/)")
    args = parser.parse_args()
    args.out = args.out or (RESULTS if args.store == "s3" else RESULTS_FOLDER)
    os.environ.update(OFFLINE)  # before the cluster starts: its workers inherit it
    from ray.cluster_utils import Cluster

    from dualmem.config import Settings

    defaults = Settings()
    embedder = args.embedder or defaults.embedder
    concurrency = args.concurrency or defaults.evaluation.concurrency
    every = args.every or max(1, args.personas // 20)
    work = Path(tempfile.mkdtemp(prefix="rolememo-dry-")) if args.work is None else args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data = make_data(work / "data", args.personas)
    data_bytes = sum(f.stat().st_size for f in data.iterdir())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its cluster and server
    s3 = S3Server(work, BUCKET) if args.store == "s3" else Folder(work)
    driver: subprocess.Popen[str] | None = None
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        env = {
            **os.environ,
            "DUALMEM_CHAT_MODEL": "fake:memory",
            "DUALMEM_EMBEDDER": embedder,
            "DUALMEM_STORE_OPTIONS": json.dumps(s3.options),
            "DUALMEM_CONCURRENCY": str(concurrency),
            "DUALMEM_CHECKPOINT_PATH": str(work / "checkpoints.sqlite"),
            "COLUMNS": "200",
        }
        exe = shutil.which("dualmem", path=str(Path(sys.executable).parent)) or "dualmem"
        cmd = [exe, "ingest", str(data), "-d", "rolememo", "--ray", cluster.address, "--store", s3.uri]
        cmd += ["--sessions", str(args.sessions)] if args.sessions else []
        print(f"{args.personas} personas, embedder {embedder}, concurrency {concurrency}: {' '.join(cmd)}", flush=True)
        watch = Watch()
        watch.begin()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        log = (work / "driver.log").open("w")
        started = time.perf_counter()
        driver = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reports, calls, lease_lines, other, first_s, marks, due = [], 0, [], [], None, [], False
        waits: list[float] = []
        mark_at = max(1, args.personas // 5)
        for line in driver.stdout:  # type: ignore[union-attr]
            log.write(line)
            line = line.rstrip("\n")
            if got := REPORT.match(line) or SKIPPED.match(line):
                reports.append({k: int(v) if v.isdigit() else v for k, v in got.groupdict().items()})
                first_s = first_s or time.perf_counter() - started
                due = len(reports) % mark_at == 0 and len(reports) < args.personas  # taken after its cost line
                if len(reports) % every == 0 or len(reports) == args.personas:
                    t = time.perf_counter() - started
                    print(f"[{t:7.1f} s] {len(reports)}/{args.personas} histories written", flush=True)
            elif got := CALLS.match(line):
                calls += int(got.group("calls"))
                if due:
                    marks.append(snapshot(s3, watch, driver.pid, reports, calls, time.perf_counter() - started))
                    due = False
            if got := WAITED.match(line):
                waits.append(float(got.group("s")))
            if LEASE.search(line):
                lease_lines.append(line)
            if line.strip() and not ROUTINE.match(line):
                other.append(line)
                print(f"  driver: {line}", flush=True)
        rc = driver.wait()
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        watch.end()
        log.close()
        requests = s3.requests()  # before the store is read back
        store = check_store(s3.uri, s3.options, data, args.sessions)
    finally:
        if driver is not None and driver.poll() is None:
            driver.terminate()
            driver.wait(timeout=60)
        cluster.shutdown()
        s3.close()
    procs = watch.seen
    workers = {pid: p for pid, p in procs.items() if p["cmd"].startswith("ray::UnitWorker")}
    server = s3.proc.pid if s3.proc else None
    daemons = {pid: p for pid, p in procs.items() if pid not in workers and pid not in (driver.pid, server)}
    driver_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    worker_cpu = sum(watch.used(pid) for pid in workers)
    chunks = sum(r["chunks"] for r in reports if "facts" in r)
    commits = sum(store["table_versions"].values())
    per_chunk = {
        "model_calls": round(calls / max(1, chunks), 3),
        "harness_cpu_s": round((driver_cpu + worker_cpu) / max(1, chunks), 4),
        "commits": round(commits / max(1, chunks), 2),
        "requests": round(len(requests) / max(1, chunks), 1) if s3.proc else None,
    }
    end = {
        "t_s": wall,
        "histories": len(reports),
        "chunks": chunks,
        "calls": calls,
        "requests": len(requests),
        "commits": commits,
        "harness_cpu_s": driver_cpu + worker_cpu,
    }

    def between(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        n = max(1, b["chunks"] - a["chunks"])
        return {
            "histories": [a["histories"], b["histories"]],
            "chunks": b["chunks"] - a["chunks"],
            "chunks_per_s": round((b["chunks"] - a["chunks"]) / max(1e-9, b["t_s"] - a["t_s"]), 2),
            "per_chunk": {
                "model_calls": round((b["calls"] - a["calls"]) / n, 3),
                "harness_cpu_s": round((b["harness_cpu_s"] - a["harness_cpu_s"]) / n, 4),
                "commits": round((b["commits"] - a["commits"]) / n, 2),
                "requests": round((b["requests"] - a["requests"]) / n, 1) if s3.proc else None,
            },
        }

    steady = between(marks[0], end) if marks and end["chunks"] > marks[0]["chunks"] else None
    timeline = [between(a, b) for a, b in zip(marks, [*marks[1:], end], strict=False) if b["chunks"] > a["chunks"]]
    measured = {
        "driver_rc": rc,
        "wall_s": round(wall, 1),
        "first_history_s": round(first_s or 0.0, 1),
        "histories_reported": len(reports),
        "histories_skipped": sum(1 for r in reports if "facts" not in r),
        "chunks_written": chunks,
        "failed_chunks": sum(r.get("failed", 0) for r in reports),
        "facts": sum(r.get("facts", 0) for r in reports),
        "insights": sum(r.get("insights", 0) for r in reports),
        "model_calls": calls,
        "chunks_per_s": round(chunks / wall, 2),
        "commits": commits,
        "requests": _requests_summary(requests) if s3.proc else None,
        "per_chunk": per_chunk,
        "steady_state": steady,
        "by_fifth": timeline,
        "driver_cpu_s": round(driver_cpu, 1),
        "ray_workers_cpu_s": round(worker_cpu, 1),
        "ray_daemons_cpu_s": round(sum(watch.used(pid) for pid in daemons), 1),
        "s3_server_cpu_s": round(watch.used(s3.proc.pid), 1) if s3.proc and s3.proc.pid in procs else None,
        "driver_peak_rss_mb": round(procs.get(driver.pid, {}).get("peak_rss_mb", 0.0), 1),
        "children_peak_rss_mb": round(after.ru_maxrss / 1024, 1),
        "ray_workers": len(workers),
        "ray_worker_peak_rss_mb": sorted(round(p["peak_rss_mb"], 1) for p in workers.values()),
        "lease_waits": {
            "histories_that_waited": len(waits),
            "total_s": round(sum(waits), 1),
            "longest_s": max(waits, default=0.0),
        },
        "lease_timeouts": len(lease_lines),
        "lease_timeout_lines": lease_lines[:5],
        "other_driver_lines": other[:40],
        "store": store,
    }
    ok = (
        rc == 0
        and not measured["failed_chunks"]
        and store["chunks_applied"] == store["chunks_expected"]
        and not store["namespaces_not_exactly_applied"]
        and not store["ledger_units_duplicated"]
        and not store["memory_pk_duplicated"]
        and not store["lease_rows_duplicated"]
        and not store["lease_rows_still_held"]
        and len(reports) == args.personas
    )
    result = {
        "benchmark": "RoleMemo-scale dry run: `dualmem ingest -d rolememo --ray` of synthetic personas (instant "
        "fake:memory writer) on a local Ray cluster (head 0 CPU + 2 x 1-CPU workers) into "
        + ("moto's S3 server" if s3.proc else "a local folder"),
        "command": "python benchmarks/rolememo_dry_run.py " + " ".join(sys.argv[1:]),
        "driver_command": " ".join(["dualmem", *cmd[1:]]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "setup": {
            "personas": args.personas,
            "sessions": args.sessions or "all",
            "chat_model": "fake:memory",
            "embedder": embedder,
            "concurrency": concurrency,
            "chunk_tokens": defaults.tuning.chunk_tokens,
            "dataset_bytes": data_bytes,
            "store": ("moto_server (loopback), " if s3.proc else "a local folder, ") + s3.uri,
        },
        "ok": ok,
        "measured": measured,
        "lease_waits": "measured.lease_waits: the waits for other writers that dualmem ingest reported (from 0.05 s); "
        "every persona is its own namespace with its own lease row, written by one task, so a writer waits only on "
        "its row's creation guard, shared by namespaces_sharing_a_creation_slot; lease_timeouts counts the driver's "
        "LeaseTimeout lines",
        "projection": projection(measured, args, defaults.tuning.chunk_tokens, concurrency),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": sys.version.split()[0],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("ok", "measured", "projection")}, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
