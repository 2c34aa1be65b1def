"""Evaluation units on a Ray cluster: workers on every node, one endpoint gate and one progress board for the run.

:class:`RayRunner` connects to the cluster (:func:`connect`), then starts:

- a :class:`SharedGate` actor on the head node: the endpoint's limits for
  every process of the run (``endpoint_concurrency`` calls in flight,
  ``endpoint_rpm`` started per minute); each worker installs it as its
  process's gate (:mod:`dualmem.models.limits`), so every model call of every node
  waits on it. A slot not given back within its lease (a worker killed
  mid-call) is taken back when the lease ends.
- a :class:`Board` actor on the head node: progress marks, counted once per
  (unit, step), so a unit run again does not advance a bar twice;
- :class:`UnitWorker` actors, one per CPU of the cluster (``num_cpus=1``
  each, so Ray places them over the nodes by their CPUs): each runs units in
  threads (:func:`dualmem.evals.unit.run_unit`), one Ray actor task per unit.

Batch ingest (:mod:`dualmem.evals.ingest`) runs on the same workers: one
history per actor task (:meth:`RayRunner.write`).

The driver only schedules: each branch of the evaluate graph hands its unit
to the least busy live worker and waits; while waiting, one branch at a time
reads the board and advances the driver's bars. A worker that dies (its
process killed, its node removed) fails its tasks with ``RayActorError``; the
runner drops it, starts another where a CPU is free, and runs the lost units
again on a live worker — their recorded steps are read back, the writer's
ledger skips applied chunks, so nothing is applied or scored twice. Every actor
belongs to the driver's job: a driver that ends, or is killed, takes them with
it (:meth:`RayRunner.close` ends them at once).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Any

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.evals.unit import Unit, UnitEnv, run_unit
from dualmem.models.limits import SharedGate, endpoint_of, install
from dualmem.preflight import require_extra
from dualmem.schema import DatasetItem

POLL_S = 0.5
HEAD = "node:__internal_head__"  # the resource Ray gives the head node only
log = logging.getLogger("dualmem.evals.cluster")
RAY_FIX = "pass --ray auto (a cluster started on this machine), --ray local, HOST:PORT (its GCS) or ray://HOST:10001"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigurationError("--ray needs Ray: pip install 'dualmem[ray]' (here and on every node)") from None
    return ray


def check_address(address: str) -> str:
    """Return a Ray address that is well formed and (for HOST:PORT and ray://) answers; else raise naming the fix."""
    require_extra("ray", "--ray")
    if address in ("auto", "local"):
        return address
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in target:
        raise ConfigurationError(f"--ray {address!r} is not a Ray address; {RAY_FIX}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start it (`ray start --head`, "
            f"`ray up`, KubeRay) or {RAY_FIX}"
        ) from None
    return address


def connect(address: str) -> bool:
    """Connect this process to the Ray cluster at ``address`` (``local``: start one on this machine); one-line errors.

    Return whether this call connected (False: the process was connected already, and stays so after the run)."""
    ray = _ray()
    address = check_address(address)
    if ray.is_initialized():
        return False
    try:
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except ImportError:
        raise ConfigurationError(
            f"--ray {address}: Ray Client needs its extra: pip install 'ray[client]==2.60.0'"
        ) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot join the Ray cluster at {address}: {' '.join(str(exc).split())[:200]}; {RAY_FIX}"
        ) from None
    return True


def disconnect() -> None:
    """Leave the Ray cluster (a local one started by :func:`connect` stops)."""
    _ray().shutdown()


class RayGate:
    """A worker process's view of the run's :class:`SharedGate` (:class:`dualmem.models.limits.Gate`)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def acquire(self) -> int:
        """Wait for a slot of the shared gate."""
        return int(_ray().get(self.handle.acquire.remote()))

    def release(self, token: int) -> None:
        """Give the slot back (not waited for)."""
        self.handle.release.remote(token)


class Board:
    """Progress marks of a run, each counted once (a Ray actor)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.counts: dict[str, int] = {}

    def mark(self, kind: str, key: str) -> None:
        """Count step ``key`` of ``kind`` (again: no change)."""
        if (kind, key) not in self.seen:
            self.seen.add((kind, key))
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def read(self) -> dict[str, int]:
        """Return the count per kind."""
        return dict(self.counts)


class UnitWorker:
    """Runs units in threads of one process of a node (a Ray actor); every model call waits on the run's gate."""

    def __init__(self, env: UnitEnv, gate: Any, board: Any) -> None:
        self.env, self.board = env, board
        install(endpoint_of(env.settings), RayGate(gate))

    def ready(self) -> str:
        """Return this worker's node id (once the worker has started)."""
        return str(_ray().get_runtime_context().get_node_id())

    def run(self, unit: Unit, item: DatasetItem) -> dict[str, Any]:
        """Run one unit; its progress goes to the board."""
        board = self.board

        def hook(kind: str, key: Any) -> Any:
            return lambda payload: board.mark.remote(kind, f"{unit.name}\x1f{key(payload)}")

        env = dataclasses.replace(
            self.env,
            on_record=hook("record", lambda r: r["query_id"]),
            on_ingest=hook("ingest", lambda s: s.id),
            on_judged=hook("judged", lambda r: r["query_id"]),
        )
        return run_unit(unit, item, env)

    def write(self, job: Any) -> Any:
        """Write one history into the shared store (batch ingest: :mod:`dualmem.evals.ingest`); mark it on the board."""
        report = job.write(self.env.settings)
        self.board.mark.remote("ingest", "\x1f".join(job.namespace))
        return report

    def usage(self) -> tuple[float, float]:
        """Return the CPU seconds (user + system) and the peak memory (MB) of this worker's process."""
        import resource

        times = os.times()
        return times.user + times.system, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RayRunner:
    """Run units on the Ray cluster at ``address`` (see the module docstring); ``hooks`` advance the driver's bars."""

    def __init__(self, env: UnitEnv, address: str, *, units: int, owns: bool = False) -> None:
        ray = _ray()
        self._owns = (
            owns or not ray.is_initialized()
        )  # a connection made for this run is closed with it, not the caller's
        connect(address)
        self.address, self.env, self.ray = address, env, ray
        s = env.settings
        here = _home(ray)
        lease = (s.request_timeout or 3600.0) + 60.0
        self.gate = ray.remote(num_cpus=0, max_concurrency=100_000, **here)(SharedGate).remote(
            s.endpoint_concurrency, s.endpoint_rpm, lease
        )
        self.board = ray.remote(num_cpus=0, **here)(Board).remote()
        self._worker_class = ray.remote(num_cpus=1, max_concurrency=max(1, s.evaluation.concurrency))(UnitWorker)
        self._env_ref = ray.put(env)
        self.busy: dict[Any, int] = {}
        self.lost = 0
        self._lock = threading.Lock()
        self._poll = threading.Lock()
        self._seen: dict[str, int] = {}
        self._next_poll = 0.0
        self.cancelled = False
        cpus = int(ray.cluster_resources().get("CPU", 0))
        try:
            if cpus < 1:
                raise ConfigurationError(
                    f"the Ray cluster at {address} has no CPU to run workers on; add worker nodes (num-cpus >= 1)"
                )
            self._start(min(cpus, max(1, units)))
        except BaseException:
            self.close(cancel=True)
            raise

    def _start(self, n: int) -> None:
        workers = [self._worker_class.remote(self._env_ref, self.gate, self.board) for _ in range(n)]
        try:
            self.ray.get([w.ready.remote() for w in workers], timeout=300)
        except Exception as exc:  # noqa: BLE001 - a worker that cannot start: dualmem missing there, say
            raise ConfigurationError(
                f"the Ray workers did not start ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                "install this dualmem on every node (`pip install dualmem[ray]`)"
            ) from None
        with self._lock:
            self.busy.update({w: 0 for w in workers})

    def describe(self) -> str:
        """Return where units run, for the report."""
        return f"Ray cluster ({self.address}): {len(self.busy)} workers, {self.lost} lost"

    def run(self, unit: Unit, item: DatasetItem) -> dict[str, Any]:
        """Run ``unit`` on the least busy live worker; run it again elsewhere if that worker dies."""
        return self._call("run", unit, item)

    def write(self, job: Any) -> Any:
        """Write one history (batch ingest) on the least busy live worker; again elsewhere if that worker dies."""
        return self._call("write", job)

    def _call(self, method: str, *args: Any) -> Any:
        """Call ``method`` of the least busy live worker and wait for it (see :meth:`run`)."""
        ray = self.ray
        while True:
            if self.cancelled:
                raise KeyboardInterrupt("the run was cancelled")
            if not self.busy and self.ray.available_resources().get("CPU", 0) >= 1:
                self._start(1)  # every worker was lost, but the cluster has room again
            with self._lock:
                if not self.busy:
                    raise RuntimeError(
                        "every Ray worker of the run died; the record keeps what finished: resume the run"
                    )
                worker = min(self.busy, key=lambda w: self.busy[w])
                self.busy[worker] += 1
            ref = getattr(worker, method).remote(*args)
            try:
                while not ray.wait([ref], timeout=POLL_S)[0]:
                    self.poll()
                    if self.cancelled:
                        raise KeyboardInterrupt("the run was cancelled")
                return ray.get(ref)
            except ray.exceptions.ActorUnavailableError:  # unreachable for now (a network blip): ask it again
                time.sleep(POLL_S)
            except ray.exceptions.RayActorError as exc:
                log.warning(
                    "a Ray worker of the run was lost (%s); its unit runs again on another",
                    " ".join(str(exc).split())[:300],
                )
                self._lose(worker)
            except (
                ray.exceptions.ObjectLostError
            ):  # finished on a node that went away before the result came: run it again
                pass
            finally:
                with self._lock:
                    if worker in self.busy:
                        self.busy[worker] -= 1

    def _lose(self, worker: Any) -> None:
        """Drop a dead worker; start another where a CPU is free (a replaced node, a killed process's CPU). A new
        worker takes units only once it has started, so none goes to a worker placed on a node that is going away."""
        with self._lock:
            if self.busy.pop(worker, None) is None:
                return
            self.lost += 1
        if self.ray.available_resources().get("CPU", 0) < 1:
            return
        fresh = self._worker_class.remote(self._env_ref, self.gate, self.board)
        try:
            self.ray.get(fresh.ready.remote(), timeout=120)
        except Exception:  # noqa: BLE001 - it could not start there after all: the live workers go on
            self.ray.kill(fresh)
            return
        with self._lock:
            self.busy[fresh] = 0

    def poll(self) -> None:
        """Advance the driver's bars to the board's counts (one branch at a time, every POLL_S)."""
        now = time.monotonic()
        if now < self._next_poll or not self._poll.acquire(blocking=False):
            return
        try:
            self._next_poll = now + POLL_S
            try:
                counts = self.ray.get(self.board.read.remote())
            except Exception as exc:  # noqa: BLE001 - the bars stop; the run goes on (never blamed on a worker)
                log.warning("progress is no longer shown: the run's progress board is gone (%s)", type(exc).__name__)
                self._next_poll = float("inf")
                return
            for kind, hook in (
                ("record", self.env.on_record),
                ("ingest", self.env.on_ingest),
                ("judged", self.env.on_judged),
            ):
                for _ in range(counts.get(kind, 0) - self._seen.get(kind, 0)):
                    if hook is not None:
                        hook(None)
                self._seen[kind] = counts.get(kind, 0)
        finally:
            self._poll.release()

    def stats(self) -> dict[str, Any]:
        """Return the gate's counts and the workers' CPU seconds (for benchmarks)."""
        workers = list(self.busy)
        usage = self.ray.get([w.usage.remote() for w in workers])
        return {
            **self.ray.get(self.gate.stats.remote()),
            "worker_cpu_s": round(sum(u[0] for u in usage), 1),
            "worker_peak_rss_mb": round(max((u[1] for u in usage), default=0.0)),
            "workers": len(workers),
            "lost": self.lost,
            "cpus": int(self.ray.cluster_resources().get("CPU", 0)),
        }

    def close(self, *, cancel: bool = False) -> None:
        """End the run's actors now (``cancel``: units in flight stop too); disconnect; idempotent."""
        self.cancelled = self.cancelled or cancel
        if not self.ray.is_initialized():
            return
        if not cancel:
            self.poll()
        for actor in [*self.busy, self.gate, self.board]:
            self.ray.kill(actor)
        self.busy.clear()
        if self._owns:
            self.ray.shutdown()


def _home(ray: Any) -> dict[str, Any]:
    """Return the options that put an actor on the head node, which lives as long as the cluster (the run's gate and
    board must outlive any worker node); on a cluster without the head's marker resource, on the driver's node."""
    if HEAD in ray.cluster_resources():
        return {"resources": {HEAD: 0.001}}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        return {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=True
            )
        }
    except Exception:  # noqa: BLE001 - a client connection has no node of its own: anywhere will do
        return {}


def settings_need_specs(settings: Settings, objects: list[str]) -> None:
    """Raise when a Ray run was given objects that cannot travel to other machines (models, embedders, factories)."""
    if objects:
        raise ConfigurationError(
            f"a Ray run loads every model by name on each node; this run was given {', '.join(objects)} "
            "as objects: pass specs instead (e.g. --model vllm:NAME), or run without --ray"
        )
