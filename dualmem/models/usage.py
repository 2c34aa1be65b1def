"""What each model call costs: the call observer of the calling context and the record of one attempt.

:func:`dualmem.models.retry.invoke_with_retry` (the one place every model call passes) reports every attempt to the
observer set with :func:`observe_calls` — evaluation runs and ``dualmem ingest`` set one to count what memory
costs: a :class:`CallRecord` with the chat requests it made, their input and output tokens (LangChain's own
``AIMessage.usage_metadata``, as :class:`~langchain_core.callbacks.UsageMetadataCallbackHandler` reads it, else the
texts for the observer to count; a runnable that is no chat model, such as a function of the user's around a
model, is one request: the usage of the message it returns, itself or as ``raw``, else the texts of its prompt and
of that message), its latency and whether it failed; a provider embedder's calls
(:class:`~dualmem.models.RemoteEmbeddings`) likewise, with their texts. No observer: nothing is recorded.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.embeddings import Embeddings
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config, merge_configs


@dataclass(frozen=True)
class CallRecord:
    """One attempt of a model or embedding call, as the context's call observer hears of it (see the module)."""

    kind: str  # "chat" or "embedding"
    model: str
    requests: int  # requests the attempt sent (an agent-style runnable may send several)
    input_tokens: int  # as the endpoint reported them
    output_tokens: int
    unreported: tuple[
        str, str
    ]  # prompt and answer texts of the requests it reported no usage for (the observer counts them)
    seconds: float
    attempt: int  # 1: the first try; more: a retry
    failed: bool


CallObserver = Callable[[CallRecord], None]
_OBSERVER: contextvars.ContextVar[CallObserver | None] = contextvars.ContextVar("dualmem_call_observer", default=None)


def call_observer() -> CallObserver | None:
    """Return the call observer of the calling context (None: none)."""
    return _OBSERVER.get()


@contextmanager
def observe_calls(observer: CallObserver | None) -> Iterator[None]:
    """Report every model call attempt made inside (in this context and those copied from it) to ``observer``."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def _message_text(message: BaseMessage) -> str:
    calls = getattr(message, "tool_calls", None) or []
    content = message.content if isinstance(message.content, str) else json.dumps(message.content, default=str)
    return content + "".join(json.dumps(c.get("args", {}), default=str) for c in calls)


def _answer_of(result: Any) -> BaseMessage | None:
    """Return the model's message in a plain runnable's result: the result itself, or the ``raw`` message of a
    structured output asked ``include_raw=True``; None when it holds none."""
    if isinstance(result, BaseMessage):
        return result
    raw = result.get("raw") if isinstance(result, dict) else None
    return raw if isinstance(raw, BaseMessage) else None


def _prompt_text(value: Any) -> str:
    """Return the text a runnable's input sends: a string, or its messages' texts; else the value as a string."""
    if isinstance(value, PromptValue):
        value = value.to_messages()
    if isinstance(value, list | tuple) and value and all(isinstance(m, BaseMessage) for m in value):
        return "\n".join(_message_text(m) for m in value)
    return str(value)


class _Usage(BaseCallbackHandler):
    """Usage of the chat requests one attempt sends: ``usage_metadata`` of each answer, else counted tokens."""

    run_inline = True  # async calls: heard in the caller's task, not in an executor thread

    def __init__(self) -> None:
        self.lock, self.model, self.prompts = threading.Lock(), "", dict[UUID, str]()
        self.requests = self.input_tokens = self.output_tokens = 0
        self.unreported = ("", "")

    def _start(self, run_id: UUID, prompt: str, metadata: dict[str, Any] | None) -> None:
        with self.lock:
            self.requests += 1
            self.prompts[run_id] = prompt
            self.model = self.model or str((metadata or {}).get("ls_model_name") or "")

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Note one chat request and its prompt."""
        self._start(run_id, "\n".join(_message_text(m) for batch in messages for m in batch), metadata)

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Note one completion request and its prompt."""
        self._start(run_id, "\n".join(prompts), metadata)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Add the request's usage: the endpoint's figures, else its prompt and answer (to be counted)."""
        gens = [g for batch in response.generations for g in batch]
        usage = [u for g in gens if (u := getattr(getattr(g, "message", None), "usage_metadata", None))]
        with self.lock:
            prompt = self.prompts.pop(run_id, "")
            if usage:
                self.input_tokens += sum(u["input_tokens"] for u in usage)
                self.output_tokens += sum(u["output_tokens"] for u in usage)
            else:
                answer = "".join(_message_text(g.message) if hasattr(g, "message") else g.text for g in gens)
                self.unreported = (self.unreported[0] + prompt + "\n", self.unreported[1] + answer + "\n")


class _Observed:
    """One attempt under the context's observer: the config that hears its usage, then its :class:`CallRecord`."""

    def __init__(self, observer: CallObserver, runnable: Any, value: Any, attempt: int) -> None:
        self.observer, self.runnable, self.value, self.attempt = observer, runnable, value, attempt
        self.usage, self.started, self.result = _Usage(), time.perf_counter(), None

    def config(self, config: Any) -> Any:
        """Return ``config`` (or the inherited one) with this attempt's usage handler added."""
        return (
            merge_configs(ensure_config(config), {"callbacks": [self.usage]})
            if isinstance(self.runnable, Runnable)
            else config
        )

    def done(self, result: Any, failed: bool) -> None:
        """Report the attempt."""
        seconds = time.perf_counter() - self.started
        owner = getattr(self.runnable, "__self__", None)
        if isinstance(owner, Embeddings):
            texts = "\n".join([self.value] if isinstance(self.value, str) else [str(t) for t in self.value or []])
            model = str(getattr(getattr(owner, "inner", owner), "model", "") or type(owner).__name__)
            record = CallRecord("embedding", model, 1, 0, 0, (texts, ""), seconds, self.attempt, failed)
        else:
            u = self.usage
            unreported, requests = u.unreported, u.requests
            tokens_in, tokens_out = u.input_tokens, u.output_tokens
            if not requests:  # no chat model heard from (a plain runnable): one request
                requests, answer = 1, None if failed else _answer_of(result)
                usage = getattr(answer, "usage_metadata", None)
                if usage:  # the message it returned says what it cost
                    tokens_in, tokens_out = usage["input_tokens"], usage["output_tokens"]
                else:  # its prompt's and answer's texts to count, not their objects' reprs
                    shown = "" if failed else _message_text(answer) if answer is not None else str(result)
                    unreported = (_prompt_text(self.value), shown)
            model = u.model or str(getattr(self.runnable, "model_name", "") or type(self.runnable).__name__)
            record = CallRecord(
                "chat", model, requests, tokens_in, tokens_out, unreported, seconds, self.attempt, failed
            )
        self.observer(record)


@contextmanager
def observing(runnable: Any, value: Any, attempt: int) -> Iterator[_Observed | None]:
    """Observe one attempt (the body sets ``result``) when the context has an observer and the call is a model's (a
    Runnable or an embedder)."""
    observer = _OBSERVER.get()
    counted = isinstance(runnable, Runnable) or isinstance(getattr(runnable, "__self__", None), Embeddings)
    seen = _Observed(observer, runnable, value, attempt) if observer is not None and counted else None
    try:
        yield seen
    except BaseException:
        if seen is not None:
            seen.done(None, failed=True)
        raise
    if seen is not None:
        seen.done(seen.result, failed=False)
