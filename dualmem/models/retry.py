"""Model calls that survive failing endpoints: transient errors retried with backoff.

A call that fails with a *transient* error (HTTP 408/409/425/429/5xx, a timeout,
a refused or dropped connection) is retried up to ``settings.call_retries``
times. The wait doubles from ``retry_backoff`` seconds (with jitter, so many
workers do not retry in step) and a server's ``Retry-After`` /
``retry-after-ms`` header is honoured: DualMem waits at least that long. A
server asking for more than ``retry_max_wait`` seconds ends the call at once
instead of being hammered.

What ends a call, raised from the original exception:

- :class:`~dualmem.errors.ConfigurationError` when the endpoint rejects the
  credentials or does not know the model (401, 402, 403, 404): every later call
  would fail the same way, so the run stops with the fix named;
- :class:`~dualmem.errors.ModelCallError` otherwise (retries exhausted, a 400,
  any other exception from the model): callers record it — a failed chunk, a
  judge error — and go on.

Each attempt holds one slot of the endpoint's gate (:mod:`dualmem.models.limits`:
``endpoint_concurrency`` calls in flight, ``endpoint_rpm`` started per minute,
shared by every node of a cluster run), taken in :func:`_call` / :func:`_acall`,
the one place every model call passes; a backoff between attempts holds none.

Sync and async calls share :func:`next_wait`; only the sleeping differs.

Every attempt is also reported to the call observer of the calling context,
when one is set (:mod:`dualmem.models.usage`: tokens, requests, latency, failure).

>>> policy = RetryPolicy(retries=2, backoff=0.0, max_wait=1.0)
>>> invoke_with_retry(lambda x: x + 1, 1, policy=policy)
2
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from typing_extensions import TypedDict, Unpack

from dualmem.config import Settings
from dualmem.errors import ConfigurationError, DualMemError, ModelCallError
from dualmem.models.limits import Gate, aslot, gate_for, slot
from dualmem.models.usage import observing

TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
CONFIG_STATUS = {
    401: "the endpoint rejected the credentials",
    402: "the account behind the key cannot pay for the call",
    403: "the key is not allowed to use this model",
    404: "the endpoint does not know this model or path",
}
CONNECTION_ERRORS = frozenset({"APIConnectionError", "APITimeoutError", "ServiceUnavailableError", "OverloadedError"})
log = logging.getLogger("dualmem.retry")
OnRetry = Callable[[int, BaseException, float], None]  # (attempt that failed, its error, seconds until the next)
KEY_FIX = (
    "set the provider's API key (OPENAI_API_KEY / settings.openai_api_key, ANTHROPIC_API_KEY, …) and the model name"
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transiently failing model call."""

    retries: int
    backoff: float
    max_wait: float
    gate: Gate | None = field(default=None, compare=False)  # the endpoint's limits (dualmem.models.limits); None: none

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> RetryPolicy:
        """Return the policy of ``settings`` (``call_retries``, ``retry_backoff``, ``retry_max_wait``, the endpoint's gate)."""
        s = settings or Settings()
        return cls(
            retries=s.call_retries, backoff=s.tuning.retry_backoff, max_wait=s.tuning.retry_max_wait, gate=gate_for(s)
        )


def as_policy(policy: RetryPolicy | Settings | None) -> RetryPolicy:
    """Return a policy from a policy, settings, or None (the environment's settings)."""
    return policy if isinstance(policy, RetryPolicy) else RetryPolicy.from_settings(policy)


def status_of(exc: BaseException) -> int | None:
    """Return the HTTP status carried by an exception (OpenAI, Anthropic, httpx), if any."""
    for obj in (exc, getattr(exc, "response", None)):
        code = getattr(obj, "status_code", None)
        if isinstance(code, int):
            return code
    return None


def retry_after(exc: BaseException) -> float | None:
    """Return the seconds a server asked to wait (``retry-after-ms`` or ``Retry-After``), if it did."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or getattr(exc, "headers", None)
    if not headers:
        return None
    try:
        return max(0.0, float(headers.get("retry-after-ms")) / 1000)
    except (TypeError, ValueError):
        pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in out and len(out) < 8:
        out.append(node)
        node = node.__cause__ or node.__context__
    return out


def is_connection_error(exc: BaseException) -> bool:
    """Return True for a timeout, a refused, unresolvable or dropped connection."""
    for err in _chain(exc):
        if isinstance(err, (httpx.TransportError, ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in CONNECTION_ERRORS for cls in type(err).__mro__):
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """Return True when retrying the same call later may succeed."""
    status = status_of(exc)
    if status is not None:
        return status in TRANSIENT_STATUS or status >= 500
    return is_connection_error(exc)


def describe_error(exc: BaseException) -> str:
    """Return a short one-line description of a failed call: status, type and message."""
    status = status_of(exc)
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    head = f"HTTP {status} " if status is not None else ""
    return f"{head}{type(exc).__name__}: {text}"


def next_wait(policy: RetryPolicy, attempt: int, exc: BaseException) -> float:
    """Return the seconds to wait before attempt ``attempt + 1``; raise the error that ends the call.

    Shared by :func:`invoke_with_retry` and :func:`ainvoke_with_retry`.
    """
    if isinstance(exc, DualMemError):
        raise exc
    status = status_of(exc)
    if status in CONFIG_STATUS:
        raise ConfigurationError(
            f"model call refused: {CONFIG_STATUS[status]} ({describe_error(exc)}); {KEY_FIX}"
        ) from exc
    if not is_transient(exc):
        raise ModelCallError(f"model call failed: {describe_error(exc)}", attempts=attempt, status=status) from exc
    if attempt > policy.retries:
        raise ModelCallError(
            f"model call failed after {attempt} attempts: {describe_error(exc)}",
            attempts=attempt,
            transient=True,
            status=status,
        ) from exc
    asked = retry_after(exc)
    if asked is not None and asked > policy.max_wait:
        raise ModelCallError(
            f"model call failed: the server asked to wait {asked:.0f} s, more than retry_max_wait={policy.max_wait:g} s "
            f"({describe_error(exc)}); run again later",
            attempts=attempt,
            transient=True,
            status=status,
        ) from exc
    backoff = min(policy.max_wait, policy.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
    return max(backoff, asked or 0.0)


class RetryOptions(TypedDict, total=False):
    """Keyword options of :func:`invoke_with_retry` and :func:`ainvoke_with_retry` (all optional)."""

    policy: RetryPolicy | Settings | None  # a policy, or the settings it comes from (default: the environment's)
    config: Any  # the RunnableConfig passed to ``invoke``
    passthrough: tuple[
        type[BaseException], ...
    ]  # re-raised untouched (a caller's own handling, e.g. structured repair)
    on_retry: OnRetry | None  # hears of each retry (every retry is also logged on the ``dualmem.models.retry`` logger)


class _Attempts:
    """The attempts of one call: what to do after each failure (the core both shells share)."""

    def __init__(
        self,
        *,
        policy: RetryPolicy | Settings | None = None,
        config: Any = None,
        passthrough: tuple[type[BaseException], ...] = (),
        on_retry: OnRetry | None = None,
    ) -> None:
        self.rules, self.config, self.passthrough, self.on_retry = as_policy(policy), config, passthrough, on_retry
        self.attempt = 0

    def wait_after(self, exc: Exception) -> float:
        """Return the seconds to wait before the next attempt, or raise ``exc`` (passthrough) or what ends the call."""
        if isinstance(exc, self.passthrough):
            raise exc
        self.attempt += 1
        wait = next_wait(self.rules, self.attempt, exc)
        log.warning(
            "model call failed (%s); retry %d of %d in %.1f s",
            describe_error(exc),
            self.attempt,
            self.rules.retries,
            wait,
        )
        if self.on_retry is not None:
            self.on_retry(self.attempt, exc, wait)
        return wait


def _call(runnable: Any, value: Any, config: Any, gate: Gate | None, attempt: int = 1) -> Any:
    with slot(gate), observing(runnable, value, attempt) as seen:
        config = seen.config(config) if seen is not None else config
        result = (
            (runnable.invoke(value, config=config) if config is not None else runnable.invoke(value))
            if hasattr(runnable, "invoke")
            else runnable(value)
        )
        if seen is not None:
            seen.result = result
        return result


async def _acall(runnable: Any, value: Any, config: Any, gate: Gate | None, attempt: int = 1) -> Any:
    async with aslot(gate):
        with observing(runnable, value, attempt) as seen:
            config = seen.config(config) if seen is not None else config
            if hasattr(runnable, "ainvoke"):
                result = await (
                    runnable.ainvoke(value, config=config) if config is not None else runnable.ainvoke(value)
                )
            else:
                result = await asyncio.to_thread(runnable, value)  # in a copy of this context
            if seen is not None:
                seen.result = result
            return result


def invoke_with_retry(
    runnable: Any, value: Any, *, sleep: Callable[[float], None] = time.sleep, **options: Unpack[RetryOptions]
) -> Any:
    """Invoke a runnable (or call a function) with ``value``; retry transient errors (see the module and :class:`RetryOptions`)."""
    attempts = _Attempts(**options)
    while True:
        try:
            return _call(runnable, value, attempts.config, attempts.rules.gate, attempts.attempt + 1)
        except Exception as exc:  # noqa: BLE001 - passthrough re-raised; the rest classified by next_wait: retried, or raised as a DualMem error
            sleep(attempts.wait_after(exc))


async def ainvoke_with_retry(runnable: Any, value: Any, **options: Unpack[RetryOptions]) -> Any:
    """Async :func:`invoke_with_retry` (same :class:`_Attempts`, ``asyncio.sleep``)."""
    attempts = _Attempts(**options)
    while True:
        try:
            return await _acall(runnable, value, attempts.config, attempts.rules.gate, attempts.attempt + 1)
        except Exception as exc:  # noqa: BLE001 - as in invoke_with_retry
            await asyncio.sleep(attempts.wait_after(exc))
