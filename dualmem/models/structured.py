"""Structured output with repair: one core shared by the sync and async paths.

Models that implement ``with_structured_output`` (OpenAI-compatible endpoints,
the bundled local model, the test fakes) are asked for the schema directly;
others get JSON-mode prompting. Either way a malformed answer is fed back with
its error and retried; after ``retries`` repairs the result says it failed —
callers record that, never drop it.

Each call goes through :func:`dualmem.models.retry.invoke_with_retry`: transient
endpoint errors are retried with backoff (``policy``: a
:class:`~dualmem.models.retry.RetryPolicy` or the ``Settings`` it comes from). A call
that still fails ends the attempt loop at once with ``call_failed`` set (no
repair: there is no answer to repair); a refused credential raises
:class:`~dualmem.errors.ConfigurationError`.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, ValidationError
from typing_extensions import TypedDict, Unpack

from dualmem.config import Settings, setting_default
from dualmem.errors import ModelCallError
from dualmem.models.retry import RetryOptions, RetryPolicy, ainvoke_with_retry, invoke_with_retry

T = TypeVar("T", bound=BaseModel)


def _output_errors() -> tuple[type[BaseException], ...]:
    """Return the exception types that mean "the answer was unusable" (retry), not "the call failed"."""
    errors: list[type[BaseException]] = [ValueError, ValidationError]
    try:  # the OpenAI client raises when a structured answer hits the length limit
        from openai import ContentFilterFinishReasonError, LengthFinishReasonError

        errors += [LengthFinishReasonError, ContentFilterFinishReasonError]
    except ImportError:  # pragma: no cover - openai is optional
        pass
    return tuple(errors)


OUTPUT_ERRORS = _output_errors()
ANSWER_OR_CALL_ERRORS: tuple[type[BaseException], ...] = (*OUTPUT_ERRORS, ModelCallError)

JSON_INSTRUCTION = "Answer with one JSON object only, no prose, matching this JSON schema:\n{schema}"
REPAIR_INSTRUCTION = (
    "Your previous answer could not be used: {error}\n"
    "Answer again with one valid JSON object matching the schema, nothing else."
)


@dataclass
class Structured(Generic[T]):
    """The outcome of a structured call: a value, or the error after all attempts."""

    value: T | None
    error: str | None = None
    attempts: int = 0  # model calls made: repairs and transient retries included
    raw: list[str] = field(default_factory=list)
    call_failed: bool = False

    @property
    def ok(self) -> bool:
        """Return True when a valid value was produced."""
        return self.value is not None


def extract_json(text: str) -> Any:
    """Return the first JSON object found in ``text`` (fenced or bare)."""
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    candidates = [fenced.group(1)] if fenced else []
    start = text.find("{")
    if start >= 0:
        candidates.append(text[start : text.rfind("}") + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            decoder = json.JSONDecoder()
            try:
                return decoder.raw_decode(candidate)[0]
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON object found in the answer")


def _raw_text(raw: Any) -> str:
    if isinstance(raw, AIMessage):
        if raw.tool_calls:
            return json.dumps(raw.tool_calls[0].get("args", {}))
        return raw.content if isinstance(raw.content, str) else json.dumps(raw.content)
    return str(raw)


def _supports_schema(model: BaseChatModel) -> bool:
    return type(model).bind_tools is not BaseChatModel.bind_tools or (
        type(model).with_structured_output is not BaseChatModel.with_structured_output
    )


_KEEP_MODELS = 16  # the models whose structured runnables are kept: a process's writer, judge and a few more
_RUNNABLES: OrderedDict[int, tuple[BaseChatModel, dict[tuple[Any, str | None], Any]]] = OrderedDict()
_RUNNABLES_LOCK = threading.Lock()


def _structured_runnable(model: BaseChatModel, schema: type[T], method: str | None) -> Any:
    """Return ``model.with_structured_output(schema, include_raw=True)``, built once per model, schema and method
    (building it converts the schema, a few milliseconds of every writer chunk otherwise).

    Invariant: the runnables of the last ``_KEEP_MODELS`` models used are kept, each entry holding its model (so an
    id is never another model's); an older model is let go with its runnables, so a process that makes a model per
    request (a user's own key, say) does not keep them all.
    """
    kwargs = {"method": method} if method else {}
    with _RUNNABLES_LOCK:
        entry = _RUNNABLES.get(id(model))
        if entry is None:
            entry = _RUNNABLES[id(model)] = (model, {})
            while len(_RUNNABLES) > _KEEP_MODELS:
                _RUNNABLES.popitem(last=False)
        else:
            _RUNNABLES.move_to_end(id(model))
        runnables = entry[1]
        if (schema, method) not in runnables:
            runnables[(schema, method)] = model.with_structured_output(schema, include_raw=True, **kwargs)
        return runnables[(schema, method)]


def _prepare(
    model: BaseChatModel, schema: type[T], messages: list[BaseMessage], method: str | None
) -> tuple[Any, list[BaseMessage], bool]:
    """Return (runnable, first messages, native) for ``schema``."""
    if _supports_schema(model):
        try:
            return _structured_runnable(model, schema, method), list(messages), True
        except NotImplementedError:
            pass
    hint = JSON_INSTRUCTION.format(schema=json.dumps(schema.model_json_schema()))
    msgs = list(messages)
    if msgs and isinstance(msgs[0], SystemMessage):
        msgs[0] = SystemMessage(content=f"{msgs[0].content}\n\n{hint}")
    else:
        msgs.insert(0, SystemMessage(content=hint))
    return model, msgs, False


def _parse(schema: type[T], result: Any, native: bool) -> tuple[T | None, str | None, str]:
    """Return (value, error, raw text) from one model answer."""
    if native:
        raw = result.get("raw")
        text = _raw_text(raw)
        parsed = result.get("parsed")
        if parsed is not None:
            try:
                value = parsed if isinstance(parsed, schema) else schema.model_validate(parsed)
                return value, None, text
            except ValidationError as exc:
                return None, _short(exc), text
        error = result.get("parsing_error")
        if error is None and isinstance(raw, AIMessage) and not raw.tool_calls:
            try:  # some endpoints answer in content even when asked for a tool
                return schema.model_validate(extract_json(text)), None, text
            except (ValueError, ValidationError) as exc:
                return None, _short(exc), text
        return None, _short(error) if error else "the model returned no structured answer", text
    text = _raw_text(result)
    try:
        return schema.model_validate(extract_json(text)), None, text
    except (ValueError, ValidationError) as exc:
        return None, _short(exc), text


def _short(error: Any) -> str:
    return " ".join(str(error).split())[:600]


def _repair(messages: list[BaseMessage], raw: str, error: str) -> list[BaseMessage]:
    return [*messages, AIMessage(content=raw[:4000]), HumanMessage(content=REPAIR_INSTRUCTION.format(error=error))]


class _Counter:
    """Count the transient retries of one structured call."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, *_: Any) -> None:
        self.n += 1


def _core(
    schema: type[T], native: bool, msgs: list[BaseMessage], retries: int
) -> Generator[list[BaseMessage], Any, Structured[T]]:
    """Yield the messages of each attempt, receive the answer (or the exception)."""
    out: Structured[T] = Structured(value=None)
    for _ in range(retries + 1):
        out.attempts += 1
        result = yield msgs
        error: str | None
        if isinstance(result, ModelCallError):  # the endpoint failed: nothing to repair
            out.error, out.call_failed = _short(result), True
            return out
        if isinstance(result, Exception):
            value, error, raw = None, _short(result), ""
        else:
            value, error, raw = _parse(schema, result, native)
        out.raw.append(raw)
        if value is not None:
            out.value, out.error = value, None
            return out
        out.error = error
        msgs = _repair(msgs, raw, error or "invalid answer")
    return out


class StructuredOptions(TypedDict, total=False):
    """Keyword options of :func:`invoke_structured` and :func:`ainvoke_structured` (all optional)."""

    retries: int  # repairs of a bad answer (default: the ``max_retries`` setting)
    method: str | None  # ``with_structured_output``'s method (default: the model's own)
    config: Any  # the RunnableConfig of each call
    policy: RetryPolicy | Settings | None  # transient-error retries (see :mod:`dualmem.models.retry`)


class _Run(Generic[T]):
    """One structured call: the requests ``_core`` makes and the options of each model call (shared by both shells)."""

    def __init__(
        self,
        model: BaseChatModel,
        messages: list[BaseMessage],
        schema: type[T],
        *,
        retries: int = setting_default("max_retries"),
        method: str | None = None,
        config: Any = None,
        policy: RetryPolicy | Settings | None = None,
    ) -> None:
        self.runnable, msgs, native = _prepare(model, schema, messages, method)
        self.core = _core(schema, native, msgs, retries)
        self.request = next(self.core)
        self.retried = _Counter()
        self.call = RetryOptions(policy=policy, config=config, passthrough=OUTPUT_ERRORS, on_retry=self.retried)

    def answer(self, result: Any) -> Structured[T] | None:
        """Feed one call's answer (or its exception); return the result once the core is done."""
        try:
            self.request = self.core.send(result)
        except StopIteration as stop:
            stop.value.attempts += self.retried.n  # every call counts, transient retries included
            return cast("Structured[T]", stop.value)
        return None


def invoke_structured(
    model: BaseChatModel, messages: list[BaseMessage], schema: type[T], **options: Unpack[StructuredOptions]
) -> Structured[T]:
    """Ask ``model`` for ``schema``; repair up to ``retries`` times; never raise on bad output or a failed call."""
    run = _Run(model, messages, schema, **options)
    while True:
        try:
            result: Any = invoke_with_retry(run.runnable, run.request, **run.call)
        except ANSWER_OR_CALL_ERRORS as exc:  # parser and length errors raised by some providers
            result = exc
        if (done := run.answer(result)) is not None:
            return done


async def ainvoke_structured(
    model: BaseChatModel, messages: list[BaseMessage], schema: type[T], **options: Unpack[StructuredOptions]
) -> Structured[T]:
    """Async twin of :func:`invoke_structured`, driving the same ``_core``."""
    run = _Run(model, messages, schema, **options)
    while True:
        try:
            result: Any = await ainvoke_with_retry(run.runnable, run.request, **run.call)
        except ANSWER_OR_CALL_ERRORS as exc:
            result = exc
        if (done := run.answer(result)) is not None:
            return done
