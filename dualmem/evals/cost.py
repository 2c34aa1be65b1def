"""What memory costs: the model and embedding calls of a run, counted per phase, framework and persona.

Every model call passes :mod:`dualmem.models.retry`, which reports each attempt to the
call observer of its context. A :class:`Meter` is such an observer: it adds
each attempt to the row of the current phase — ``writing`` (a framework's
ingest), ``retrieval``, ``answering`` (``respond``), ``judging``, set by the
evaluation with :func:`phase`; calls outside them are ``other`` (similarity
metrics with a remote embedder) — with, per row, the requests sent (chat and
embedding), input and output tokens (the endpoint's usage figures; where it
reported none, counted here with :func:`dualmem.models.tokens.count_tokens`, and how
many were), retries, failed attempts, seconds spent in calls, and the
same per model, so that a price table (setting ``prices``) turns tokens into
money.

An evaluation unit's meter is written to the run record with each step the
unit records (:class:`dualmem.evals.record.UnitSteps`), in the same write:
a resumed run sums what every earlier attempt recorded and counts each call
once; the calls of a step a crash cut short before it was recorded (a
half-written session) are not counted, as that step's work is redone.

>>> meter = Meter()
>>> from dualmem.models.usage import CallRecord
>>> with phase("answering"):
...     meter(CallRecord("chat", "m", 1, 10, 5, ("", ""), 0.2, 1, False))
>>> meter.phases()["answering"]["input_tokens"]
10
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from dualmem.errors import ConfigurationError
from dualmem.models.tokens import count_tokens
from dualmem.models.usage import CallRecord, call_observer, observe_calls

PHASES = ("writing", "retrieval", "answering", "judging")
FIELDS = (
    "calls",
    "chat_calls",
    "embedding_calls",
    "input_tokens",
    "output_tokens",
    "counted_tokens",
    "retries",
    "failed",
    "seconds",
)
_PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("dualmem_cost_phase", default="other")
T = TypeVar("T")
Book = dict[str, Any]  # {phase: row}; a row: FIELDS and "models": {model: {"calls", "input_tokens", "output_tokens"}}


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the calls made inside under phase ``name``."""
    token = _PHASE.set(name)
    try:
        yield
    finally:
        _PHASE.reset(token)


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """Return ``fn`` counted by this context's meter and phase wherever it runs (a thread that copies no context)."""
    observer, name = call_observer(), _PHASE.get()

    def run(*args: Any, **kwargs: Any) -> T:
        with observe_calls(observer), phase(name):
            return fn(*args, **kwargs)

    return run


def add(into: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """Add the numbers of ``more`` into ``into`` (nested dicts added key by key); return ``into``."""
    for key, value in more.items():
        if isinstance(value, Mapping):
            add(into.setdefault(key, {}), value)
        else:
            into[key] = round(into.get(key, 0) + value, 6)
    return into


def _row(call: CallRecord) -> dict[str, Any]:
    chat = call.kind == "chat"
    extra_in, extra_out = (count_tokens(t) for t in call.unreported)
    tokens_in, tokens_out = call.input_tokens + extra_in, call.output_tokens + extra_out
    return {
        "calls": call.requests,
        "chat_calls": call.requests if chat else 0,
        "embedding_calls": 0 if chat else call.requests,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "counted_tokens": extra_in + extra_out,
        "retries": int(call.attempt > 1),
        "failed": int(call.failed),
        "seconds": call.seconds,
        "models": {call.model: {"calls": call.requests, "input_tokens": tokens_in, "output_tokens": tokens_out}},
    }


class Meter:
    """A call observer (:mod:`dualmem.models.retry`) that counts calls per phase; ``take`` hands over what is new since."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: Book = {}
        self._new: Book = {}

    def __call__(self, call: CallRecord) -> None:
        row, name = _row(call), _PHASE.get()
        with self._lock:
            add(self._all.setdefault(name, {}), row)
            add(self._new.setdefault(name, {}), row)

    def take(self) -> Book:
        """Return the counts since the last ``take`` (empty when no call was made) and start anew."""
        with self._lock:
            out, self._new = self._new, {}
        return out

    def phases(self) -> Book:
        """Return every count so far, per phase."""
        with self._lock:
            return add({}, self._all)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Return ``fn(*args)``, its calls counted here."""
        with observe_calls(self):
            return fn(*args)

    @contextmanager
    def counting(self, name: str | None = None) -> Iterator[Meter]:
        """Count the calls made inside here (under phase ``name`` when given)."""
        with observe_calls(self):
            if name is None:
                yield self
            else:
                with phase(name):
                    yield self


def empty_row() -> dict[str, Any]:
    """Return a row of zeros."""
    return {**dict.fromkeys(FIELDS, 0), "models": {}}


def total(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Return the sum of per-phase rows."""
    out = empty_row()
    for row in phases.values():
        add(out, row)
    return out


def tokens(row: Mapping[str, Any]) -> int:
    """Return a row's input plus output tokens."""
    return int(row.get("input_tokens", 0)) + int(row.get("output_tokens", 0))


def price_table(text: str) -> dict[str, tuple[float, float]]:
    """Parse the ``prices`` setting, ``MODEL=IN/OUT,...`` in money per million input / output tokens (``*``: any model).

    >>> price_table("gpt-4o-mini=0.15/0.6, *=1")
    {'gpt-4o-mini': (0.15, 0.6), '*': (1.0, 1.0)}
    """
    out: dict[str, tuple[float, float]] = {}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        name, sep, rate = part.rpartition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(part)
            price_in, _, price_out = rate.partition("/")
            out[name.strip()] = (float(price_in), float(price_out or price_in))
        except ValueError:
            raise ConfigurationError(
                f"prices {part!r}: write MODEL=IN/OUT per million tokens, comma-separated, "
                "e.g. --set prices='gpt-4o-mini=0.15/0.6,*=1/2'"
            ) from None
    return out


def _price(model: str, table: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    for key in (model, model.split(":", 1)[-1], "*"):
        if key in table:
            return table[key]
    return next((p for k, p in table.items() if k.split(":", 1)[-1] == model), None)


def money(phases: Mapping[str, Mapping[str, Any]], table: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """Return what the calls of each phase cost by the price table, and the models it does not price."""
    out: dict[str, Any] = {"phases": {}, "total": 0.0, "unpriced": []}
    for name, row in phases.items():
        spent = 0.0
        for model, use in (row.get("models") or {}).items():
            rate = _price(model, table)
            if rate is None:
                out["unpriced"] += [model] if model not in out["unpriced"] else []
                continue
            spent += use.get("input_tokens", 0) * rate[0] / 1e6 + use.get("output_tokens", 0) * rate[1] / 1e6
        out["phases"][name] = round(spent, 6)
    out["total"] = round(sum(out["phases"].values()), 6)
    return out


def _ordered(phases: Mapping[str, Any]) -> dict[str, Any]:
    names = [*PHASES, *sorted(set(phases) - set(PHASES))]
    return {n: add(empty_row(), phases.get(n) or {}) for n in names if n in PHASES or n in phases}


def cost_summary(units: Mapping[str, Mapping[str, Any] | None], n_queries: int, prices: str = "") -> dict[str, Any]:
    """Return the cost block of a run summary from its units' costs (``{persona: {"phases", "history_tokens"}}``)."""
    phases: dict[str, Any] = {}
    per_persona: dict[str, Any] = {}
    history = 0
    for persona, cost in sorted(units.items()):
        if not cost:
            continue
        for name, row in (cost.get("phases") or {}).items():
            add(phases.setdefault(name, {}), row)
        per_persona[persona] = _ordered(cost.get("phases") or {})
        history += int(cost.get("history_tokens") or 0)
    phases = _ordered(phases)
    whole = total(phases)
    out: dict[str, Any] = {
        "phases": phases,
        "total": whole,
        "per_persona": per_persona,
        "history_tokens": history,
        "writer_input_per_history_token": round(phases["writing"]["input_tokens"] / history, 3) if history else None,
        "tokens_per_query": round(tokens(whole) / n_queries, 1) if n_queries else None,
    }
    if prices:
        out["money"] = money(phases, price_table(prices))
    return out


def describe(cost: Mapping[str, Any]) -> str:
    """Return one line of a cost block (or a unit's): calls, tokens, retries, time, the writer's ratio, money."""
    row = cost.get("total") or total(cost.get("phases") or {})
    parts = [f"{row['calls']} model call(s)", f"{row['input_tokens']:,} input + {row['output_tokens']:,} output tokens"]
    if row.get("counted_tokens"):
        parts[-1] += f" ({row['counted_tokens']:,} counted here: the endpoint reported no usage)"
    parts += [f"{row['retries']} retr(y/ies)", f"{row['seconds']:.1f} s in calls"]
    if cost.get("writer_input_per_history_token") is not None:
        parts.append(
            f"writer input {cost['writer_input_per_history_token']:g} tokens per history token "
            f"({cost['history_tokens']:,} history tokens)"
        )
    if cost.get("money"):
        parts.append(f"{cost['money']['total']:.4f} by the price table")
    return "; ".join(parts)


def render_markdown(cost: Mapping[str, Any], table: Callable[..., str]) -> list[str]:
    """Return the report's cost section lines (``table``: the report's markdown table maker)."""
    money_of = {**(cost.get("money") or {}).get("phases", {}), "total": (cost.get("money") or {}).get("total")}
    money_of = money_of if cost.get("money") else {}
    headers = ["phase", *FIELDS, *(["money"] if money_of else [])]
    rows = [
        [name, *(row.get(f) for f in FIELDS), *([money_of.get(name)] if money_of else [])]
        for name, row in {**cost["phases"], "total": cost["total"]}.items()
    ]
    lines = ["## Cost", "", describe(cost), "", table(headers, rows), ""]
    models = {m for row in cost["phases"].values() for m in row.get("models", {})}
    if models:
        lines += [
            f"Models: {', '.join(sorted(models))}."
            + (
                f" Not in the price table: {', '.join(cost['money']['unpriced'])}."
                if money_of and cost["money"]["unpriced"]
                else ""
            ),
            "",
        ]
    return lines
