"""Personas in processes of their own: the CPU work of an evaluation on every core.

Threads of one Python process share one interpreter lock, so nine personas
evaluated at once as threads use about one core for their CPU work (prompt
building, parsing, embedding, LanceDB, metrics) however many are waiting on
the model. :class:`PersonaWorkers` runs each persona's branch — framework,
ingestion, retrieval, answers, metrics: :func:`dualmem.evals.graph.persona_result`
— in a worker process, and the evaluate graph's branch (a thread of the
evaluating process) waits for it and then runs the judges, as before.

- Workers are forked from a *forkserver* that imported dualmem, LanceDB and
  the OpenAI client once, so a worker starts in milliseconds instead of
  paying the imports again; each loads its models by name from the run's
  settings (objects cannot cross a process boundary: a run given model or
  embedder objects evaluates in threads, see :func:`workers_for`).
- Each persona writes its own store folder and the run's journal (SQLite
  WAL, one connection per process), so resuming works as with threads: a
  unit a worker recorded is never computed again.
- Progress: workers send an event per answered query and ingested session;
  a thread of the evaluating process advances the bars.
- A worker's torch threads are capped at ``cores // workers`` (at least 1).
- A worker ends with the evaluating process: killed, it cannot stop its pool,
  and an orphaned worker would go on calling models and writing memory beside
  the run that resumes it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import pickle
import queue
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from dualmem.config import Settings
from dualmem.context import context_of
from dualmem.errors import ConfigurationError
from dualmem.evals.graph import EvalRun, PersonaTask, persona_result
from dualmem.evals.journal import Journal
from dualmem.schema import DatasetItem

# imported once by the forkserver, so that workers forked from it start warm (the evaluating script or CLI too:
# see MAIN_ENV); the dualmem framework brings the retrieval pipeline and SciPy
PRELOAD = ["dualmem.evals._forkserver", "dualmem.evals.workers", "dualmem.frameworks", "dualmem.frameworks.dualmem",
           "dualmem.stores", "lancedb", "langchain_openai"]
# The path of this process's main script, for the forkserver to import once (``_forkserver``). multiprocessing's own
# "__main__" preload never runs (Python 3.11/3.12 pass the forkserver no main path), so each worker would run the
# script again, with all it imports (the CLI: plots and matplotlib, about 1 CPU-s per worker).
MAIN_ENV = "DUALMEM_FORKSERVER_MAIN"
_worker: dict[str, Any] = {}  # the worker process's run: settings, context and EvalRun


def _preload(settings: Settings) -> list[str]:
    """Modules the forkserver imports: the evaluation's own, and sentence-transformers when an embedder needs it."""
    specs = (settings.embedder, settings.eval_embedder)
    local = any(s and not s.startswith("hash:") and ":" not in s.removeprefix("bundled:") for s in specs)
    return [*PRELOAD, "sentence_transformers"] if local else PRELOAD


def _context(settings: Settings) -> Any:
    """Return the start method's context: a preloaded forkserver where the platform has one (not Windows), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_preload(settings))  # no effect once the forkserver runs
    main = multiprocessing.spawn.get_preparation_data("dualmem").get("init_main_from_path")
    if main:  # the path each worker compares with its own main module's before running the script again
        os.environ[MAIN_ENV] = main
    return ctx


def start_forkserver(settings: Settings, *, wait: bool = False) -> None:
    """Start the workers' forkserver now (``wait``: until its imports are done; else in the background, where they
    overlap the loading of the dataset). Later runs of this process reuse it."""
    ctx = _context(settings)
    if ctx.get_start_method() != "forkserver":
        return
    if wait:  # the server answers a first fork only once its imports are done
        probe = ctx.Process(target=os.getpid, name="dualmem-forkserver-probe")
        probe.start()
        probe.join()
    else:
        threading.Thread(target=multiprocessing.forkserver.ensure_running, name="dualmem-forkserver", daemon=True).start()


def workers_for(settings: Settings, personas: int, *, objects: bool) -> int:
    """Return how many worker processes evaluate ``personas`` personas (0: threads of this process).

    ``objects``: the run was given model, embedder or factory objects, which stay
    in this process. ``eval_workers`` 0 (auto) uses one process per concurrent
    persona when there are at least two and nothing is an object; 1 means
    threads; N > 1 asks for N processes (an error when objects were given).
    """
    wanted = settings.eval_workers
    if wanted == 1 or personas < 2 or settings.concurrency < 2:
        return 0
    if objects:
        if wanted > 1:
            raise ConfigurationError(f"eval_workers={wanted} runs personas in other processes, which load every model by name; "
                                     "this run was given model or embedder objects: pass specs instead, or set eval_workers=1")
        return 0
    return min(wanted or settings.concurrency, settings.concurrency, personas)


def _exit_with_parent() -> None:
    """Worker thread: end this worker when the evaluating process is gone (killed: nothing told the pool to stop)."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)


def _init(settings: Settings, chat_spec: str | None, journal_path: str | None, store_uri: str, events: Any, threads: int) -> None:
    """Worker start: follow the evaluating process, cap CPU threads, open the journal, build the branch's context."""
    threading.Thread(target=_exit_with_parent, name="dualmem-eval-parent", daemon=True).start()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    run = EvalRun(journal=Journal(journal_path) if journal_path else None, store_uri=store_uri,
                  on_record=lambda record: events.put(("record", record)), on_ingest=lambda _session: events.put(("ingest", None)))
    chat = None
    if chat_spec:
        from dualmem.models import load_chat_model

        chat = load_chat_model(chat_spec, settings)
    _worker.update(context=context_of(settings, models={"chat": chat} if chat is not None else None, run=run), run=run)


def priorities(work: dict[str, float], span: int = 15) -> dict[str, int]:
    """Return a nice value per persona from its share of the largest persona's work: 0 for the largest (the run's
    critical path), up to ``span`` for the smallest; so on a busy CPU the persona that ends the run waits least.

    >>> priorities({"long": 40, "half": 20, "tiny": 0})
    {'long': 0, 'half': 8, 'tiny': 15}
    """
    most = max(work.values(), default=0) or 1
    return {name: round(span * (1 - w / most)) for name, w in work.items()}


def _lower_priority(nice: int) -> None:
    """Raise this worker's nice value to ``nice`` (never lower it), for each of its threads (Linux sets it per thread)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
        except (OSError, AttributeError):  # gone, not allowed, or no setpriority (Windows): the run is only slower
            pass


def _run(task: PersonaTask, item: DatasetItem, nice: int = 0) -> dict[str, Any]:
    """Worker: one persona's branch; an error that would not survive pickling comes back as a RuntimeError."""
    if nice > 0:
        _lower_priority(nice)
    try:
        return persona_result(task, _worker["context"], _worker["run"], item)
    except Exception as exc:  # noqa: BLE001 - re-raised, picklable
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
        raise


class PersonaWorkers:
    """A pool of worker processes that run persona branches; ``run`` blocks the calling branch until its persona is done."""

    def __init__(self, n: int, settings: Settings, *, chat_spec: str | None, journal_path: str | None, store_uri: str,
                 on_record: Any = None, on_ingest: Any = None) -> None:
        ctx = _context(settings)
        self.n, self._closed = n, False
        self._events = ctx.Queue()
        self._hooks = {"record": on_record, "ingest": on_ingest}
        self.nice: dict[str, int] = {}  # persona -> nice value of its worker (set when each persona has a worker of its own)
        self._stop = threading.Event()
        threads = max(1, (os.cpu_count() or 1) // n)
        self._pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_init,
                                         initargs=(settings, chat_spec, journal_path, store_uri, self._events, threads))
        self._drain = threading.Thread(target=self._forward, name="dualmem-eval-progress", daemon=True)
        self._drain.start()

    def _forward(self) -> None:
        """Advance the bars for the workers' events; once stopped, take what is left in the queue, then end."""
        while True:
            try:
                kind, payload = self._events.get(timeout=0.2)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            hook = self._hooks.get(kind)
            if hook is not None:
                hook(payload)

    def run(self, task: PersonaTask, item: DatasetItem) -> dict[str, Any]:
        """Run one persona's branch in a worker and return its result (records and ingest log).

        The persona's history is sent with it: a worker loading the dataset itself
        would parse every persona's file (nine 256k-token files for RealMem) again."""
        return self._pool.submit(_run, PersonaTask(**task), item, self.nice.get(task["persona"], 0)).result()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """While inside, Ctrl-C ends the workers at once, then raises KeyboardInterrupt as usual.

        The graph's branches are threads waiting on the workers, and a graph
        interrupted in its main thread waits for its running branches: without
        this, Ctrl-C would wait until every running persona had finished."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_interrupt(signum: int, frame: Any) -> None:
            self.close(cancel=True)
            signal.default_int_handler(signum, frame)

        previous = signal.signal(signal.SIGINT, on_interrupt)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def close(self, *, cancel: bool = False) -> None:
        """Stop the workers and the progress thread; idempotent.

        ``cancel`` (the run failed or was interrupted): end the workers now rather than
        let them finish their personas; what they had recorded is kept, and a resumed
        run redoes only the unit each was in (as after a crash)."""
        if self._closed:
            return
        self._closed = True
        if cancel:
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                proc.terminate()
            self._events.cancel_join_thread()  # a worker ended mid-put must not hold this process at exit
        self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
        self._stop.set()  # workers that ended normally flushed their events before exiting
        self._drain.join(10)
