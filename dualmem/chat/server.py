"""Memory formation on a LangGraph server: scheduled runs of the ``write`` graph (``langgraph_sdk``).

Each chat thread gets a formation thread on the server (a stable UUID from the
namespace and the chat thread), so its writes run one after another. A
hand-over creates up to two background runs of the write graph in pending mode
(input ``pending: {"thread"}``), both with ``multitask_strategy="enqueue"``:

- when the pending turns reached ``chunk_tokens``: one run now;
- always: a run ``after_seconds=ceil(formation_idle_s)``, after cancelling
  (``action="rollback"``: deleted) the thread's earlier quiet-time run that is
  still more than ``CANCEL_MARGIN_S`` from starting — the debounce: each
  message postpones the write.

A run never interrupts a running write; and since the graph itself writes a
short tail only once the thread is quiet, a quiet-time run that escaped
cancellation writes nothing early. Inside the server the client talks to it in
process (``get_client(url=None)``); elsewhere it needs ``formation_url``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from dualmem.chat.formation import formation_input
from dualmem.chat.pending import FormationRequest
from dualmem.errors import ConfigurationError

log = logging.getLogger("dualmem.chat")
WRITE_GRAPH = "write"
_THREADS = uuid.UUID("5b1d8a52-2f1c-4d57-9a8e-8f1f0c4b7d21")  # namespace of formation thread ids
_TAG = "dualmem_formation"
CANCEL_MARGIN_S = 1.0  # a quiet-time run due sooner than this is not cancelled (it may be starting)


def formation_thread(request: FormationRequest) -> str:
    """Return the server thread id on which a chat thread's memory is formed."""
    return str(uuid.uuid5(_THREADS, json.dumps([*request.namespace, request.thread])))


class ServerFormation:
    """Form chat memory with scheduled ``write`` runs on a LangGraph server (in process when ``url`` is None)."""

    def __init__(
        self, url: str | None = None, graph: str = WRITE_GRAPH, client: Any = None, sync_client: Any = None
    ) -> None:
        self.url, self.graph = url, graph
        self._client, self._sync_client = client, sync_client

    def _runs(self, request: FormationRequest, now: bool) -> tuple[str, list[dict[str, Any]]]:
        """Return the formation thread and the runs to create (the core shared by both shells)."""
        tuning = request.settings.tuning  # the run's context: the caller's chunking and quiet time, never its keys
        common: dict[str, Any] = {
            "input": formation_input(request),
            "context": {"options": {"chunk_tokens": tuning.chunk_tokens, "formation_idle_s": tuning.formation_idle_s}},
            "config": {"recursion_limit": 10_000},
            "multitask_strategy": "enqueue",
            "if_not_exists": "create",
        }
        runs: list[dict[str, Any]] = [{**common, "metadata": {_TAG: "chunk"}}] if now else []
        delay = int(math.ceil(tuning.formation_idle_s))
        runs.append({**common, "metadata": {_TAG: "quiet"}, "after_seconds": delay})
        return formation_thread(request), runs

    async def aschedule(self, request: FormationRequest, *, now: bool) -> None:
        """Create the thread's write runs (a quiet-time run replaces the one not started yet)."""
        if self._client is None:
            from langgraph_sdk import get_client

            self._client = get_client(url=self.url)
        client = self._client
        thread, runs = self._runs(request, now)
        for run in runs:
            if run.get("after_seconds") is not None:
                try:
                    listed = await client.runs.list(thread, status="pending", limit=100)
                except Exception:  # noqa: BLE001 - no formation thread yet
                    listed = []
                for old in _replaceable(listed):
                    try:
                        await client.runs.cancel(thread, old, action="rollback")
                    except Exception as exc:  # noqa: BLE001 - it started meanwhile: it writes full chunks only
                        log.debug("quiet-time write run not cancelled: %s", exc)
            await client.runs.create(thread, self.graph, **run)

    def schedule(self, request: FormationRequest, *, now: bool) -> None:
        """Sync :meth:`aschedule` (a remote server: ``url`` must be set; in a server use the async agent)."""
        if self._sync_client is None:
            if not self.url:
                raise ConfigurationError(
                    "scheduling memory formation on the LangGraph server this code runs in needs the async path: "
                    "run the agent with ainvoke/astream (the server does), or set formation_url"
                )
            from langgraph_sdk import get_sync_client

            self._sync_client = get_sync_client(url=self.url)
        client = self._sync_client
        thread, runs = self._runs(request, now)
        for run in runs:
            if run.get("after_seconds") is not None:
                try:
                    olds = _replaceable(client.runs.list(thread, status="pending", limit=100))
                except Exception:  # noqa: BLE001 - no formation thread yet
                    olds = []
                for old in olds:
                    try:
                        client.runs.cancel(thread, old, action="rollback")
                    except Exception:  # noqa: BLE001 - it started meanwhile: it writes full chunks only
                        pass
            client.runs.create(thread, self.graph, **run)


def _replaceable(runs: list[dict[str, Any]]) -> list[str]:
    """Return the quiet-time runs still more than ``CANCEL_MARGIN_S`` from starting (a due one is left to run)."""
    now = datetime.now(UTC)
    out = []
    for run in runs:
        if (run.get("metadata") or {}).get(_TAG) != "quiet":
            continue
        start = run.get("created_at")  # a delayed run's creation time is when it is due
        due = datetime.fromisoformat(str(start).replace("Z", "+00:00")) if start else now
        if (due - now).total_seconds() > CANCEL_MARGIN_S:
            out.append(run["run_id"])
    return out


_servers: dict[str | None, ServerFormation] = {}
_servers_lock = threading.Lock()


def server_formation(url: str | None = None) -> ServerFormation:
    """Return the shared server formation for ``url`` (None: the server this process is)."""
    with _servers_lock:
        if url not in _servers:
            _servers[url] = ServerFormation(url)
        return _servers[url]
