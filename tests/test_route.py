"""The chat path stays short: one `remember` (the respond graph handing an exchange to memory formation) passes
through at most 12 stops.

A stop is a dualmem function entered from another dualmem module, counted once, in the calling thread, from the
``remember`` node on. A call made inside a boundary package (the store contract, model calls, the pure core, prompts,
BM25, vectors) is part of the stop that entered the package; the data model and errors are not counted. This is how
the issue that set the limit measured the route (32 stops in 0.2.0, 20 at the start of 0.4.0).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from dualmem.chat import FormationExecutor
from dualmem.graphs.respond import respond
from dualmem.schema import Persona
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings

BOUNDARY = (
    "dualmem.stores",
    "dualmem.models",
    "dualmem.memory",
    "dualmem.prompts",
    "dualmem.lexical",
    "dualmem.vectors",
)
SKIP = ("dualmem.schema", "dualmem.errors")
ENTRY = ("dualmem.nodes.respond", "remember")
MAX_STOPS = 12


def _stops(run: Any) -> list[str]:
    """Return the stops of ``run()`` from the ``remember`` node on (see the module docstring)."""
    stops: list[str] = []
    active, main = [False], threading.get_ident()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or threading.get_ident() != main:
            return
        module, name = frame.f_globals.get("__name__", "") or "", frame.f_code.co_name
        active[0] = active[0] or (module, name) == ENTRY
        if not active[0] or not module.startswith("dualmem") or module.startswith(SKIP) or name.startswith("<"):
            return
        outer = frame.f_back
        while outer is not None:  # inside a boundary package: part of the stop that entered it
            package = outer.f_globals.get("__name__", "") or ""
            if package.startswith(BOUNDARY):
                if module.startswith(BOUNDARY) and package.split(".")[1] == module.split(".")[1]:
                    return
                if not module.startswith(BOUNDARY):
                    break
            outer = outer.f_back
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        stop = f"{module}:{name}"
        if (caller != module or (module, name) == ENTRY) and stop not in stops:
            stops.append(stop)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return stops


def test_remember_passes_through_at_most_12_stops(tmp_settings):
    store = LanceDualStore(tmp_settings.store_uri, HashEmbeddings(64))
    persona = Persona(id="p", name="P", description="d")
    model = FakeChatModel(responses=["ok"], cycle=True)
    with FormationExecutor() as formation:

        def turn(text: str, thread: str) -> Any:
            return respond(
                text,
                persona,
                settings=tmp_settings,
                model=model,
                store=store,
                remember=True,
                thread_id=thread,
                formation=formation,
            )

        turn("hello there", "t0")  # the first call of a process builds things once
        replies: list[Any] = []
        stops = _stops(lambda: replies.append(turn("I moved to Lisbon", "t1")))
    assert replies[0].pending["turns"] == 2, "the exchange was handed over"
    assert stops[0] == "dualmem.nodes.respond:remember" and "dualmem.chat.pending:hand_over" in stops
    assert len(stops) <= MAX_STOPS, f"remember passes through {len(stops)} stops: {stops}"
