"""Offline fakes for tests and docs: a structured-output chat model and hash embeddings.

>>> from dualmem.schema import MemoryUpdate
>>> model = FakeChatModel(responses=[MemoryUpdate()])
>>> model.with_structured_output(MemoryUpdate).invoke("hi")
MemoryUpdate(facts=[], insights=[])
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field, PrivateAttr

# the public API: the offline fakes the docs use; the scripted answers (make_fake, editing_writer…) and the S3
# server (dualmem.testing.s3) are the project's own test helpers
__all__ = ["FakeChatModel", "HashEmbeddings"]

Response = Any  # BaseModel | dict | str | Exception | Callable[[list[BaseMessage]], Any]


class FakeChatModel(BaseChatModel):
    """A scripted chat model that supports tool calls and structured output.

    ``responses`` are consumed in order (the last one repeats when
    ``cycle=False`` runs out; with ``cycle=True`` they wrap around). A response
    may be a pydantic object or dict (returned as a tool call when a tool is
    bound, else as JSON text), a string (plain content), an exception (raised)
    or a callable taking the messages and returning any of these. ``calls``
    records every message list the model received.
    """

    responses: list[Any] = Field(default_factory=list)
    cycle: bool = False
    _state: dict[str, Any] = PrivateAttr(default_factory=lambda: {"i": 0, "calls": [], "kwargs": []})

    @property
    def _llm_type(self) -> str:
        return "dualmem-fake"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """Return the tracing params (provider ``dualmem``, model ``dualmem-fake`` unless a call names another)."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "dualmem"
        params.setdefault("ls_model_name", self._llm_type)
        return params

    @property
    def calls(self) -> list[list[BaseMessage]]:
        """Return every message list received so far."""
        return self._state["calls"]

    @property
    def call_kwargs(self) -> list[dict[str, Any]]:
        """Return the keyword arguments of every call (``.bind(max_tokens=...)`` ones among them), as ``calls``."""
        return self._state["kwargs"]

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        """Bind ``tools`` as chat models do (a ``RunnableBinding`` whose ``bound`` is this model); it answers with a call of
        the chosen tool (``tool_choice`` when it names one, else the first)."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], tool_choice=tool_choice, **kwargs)

    @staticmethod
    def _chosen(tools: Sequence[dict[str, Any]], choice: Any) -> dict[str, Any] | None:
        specs = [t["function"] for t in tools if "function" in t]
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) else choice
        return next((t for t in specs if t["name"] == name), specs[0] if specs else None)

    def _next(self, messages: list[BaseMessage], tool: str | None) -> Any:
        self._state["calls"].append(list(messages))
        if not self.responses:
            return "ok"
        i = self._state["i"]
        self._state["i"] = i + 1
        item = (
            self.responses[i % len(self.responses)] if self.cycle else self.responses[min(i, len(self.responses) - 1)]
        )
        if callable(item) and not isinstance(item, (BaseModel, type)):
            takes_tool = len(inspect.signature(item).parameters) >= 2
            item = item(messages, tool) if takes_tool else item(messages)
        return item

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        spec = self._chosen(kwargs.get("tools") or [], kwargs.get("tool_choice"))
        tool = spec["name"] if spec else None
        item = self._next(messages, tool)
        self._state["kwargs"].append({k: v for k, v in kwargs.items() if k not in ("tools", "tool_choice")})
        if isinstance(item, BaseException):
            raise item
        if spec is not None and (item is None or callable(item) and not isinstance(item, (BaseModel, type))):
            schema = spec.get("parameters") or {}
            item = minimal_instance(schema) if item is None else item(schema)
        if isinstance(item, BaseModel):
            item = item.model_dump(mode="json")
        if isinstance(item, dict):
            if tool:
                call = {"name": tool, "args": item, "id": f"call_{self._state['i']}", "type": "tool_call"}
                message = AIMessage(content="", tool_calls=[call])
            else:
                message = AIMessage(content=json.dumps(item))
        else:
            message = AIMessage(content=str(item))
        return ChatResult(generations=[ChatGeneration(message=message)])


class HashEmbeddings(Embeddings):
    """Deterministic bag-of-words embeddings: texts sharing words are close.

    >>> e = HashEmbeddings(dims=32)
    >>> len(e.embed_query("night shifts"))
    32
    """

    asymmetric = False  # queries and documents are embedded alike

    def __init__(self, dims: int = 64) -> None:
        self.dims = dims
        self.spec = f"hash:{dims}"  # what a store records, so LanceDBStore(path) reopens it with the same embedder

    def _embed(self, text: str) -> list[float]:
        vec = [0.0] * self.dims
        for token in re.findall(r"\w+", text.lower()) or [text]:
            h = int(hashlib.md5(token.encode()).hexdigest(), 16)
            vec[h % self.dims] += 1.0 if (h >> 64) & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed several texts."""
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed one text."""
        return self._embed(text)


def scripted(fn: Callable[[list[BaseMessage]], Any]) -> FakeChatModel:
    """Return a fake model whose every answer is ``fn(messages)``."""
    return FakeChatModel(responses=[fn], cycle=True)


def _unquote(text: str) -> str:
    """Return a turn's text from its quoted prompt form."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, str) else text


def said(messages: list[BaseMessage]) -> str:
    """Return a line of dialogue from the last message: the first quoted turn, else the first line of four words or more."""
    text = str(messages[-1].content) if messages else ""
    turns = [_unquote(t) for t in re.findall(r"^\[[^\]]+\][^\n]*?:\s*(\".*\")$", text, re.M)]
    lines = turns or [ln.split(":", 1)[-1].strip() for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if len(ln.split()) > 3), text[:120] or "the user said something")


def _echo_memory(messages: list[BaseMessage], tool: str | None) -> Any:
    """Answer MemoryUpdate requests with one fact and one insight taken from the chunk, other schemas filled with it."""
    from dualmem.testing.scripted import generator_answer

    user = said(messages)
    scripted_answer = generator_answer(messages, tool)
    if scripted_answer is not None:
        return scripted_answer
    if tool == "MemoryUpdate":
        return {
            "facts": [{"op": "ADD", "id": "N1", "text": f"User said: {user[:160]}", "turn_ids": []}],
            "insights": [{"op": "ADD", "id": "M1", "text": f"I read this as telling: {user[:80]}", "fact_ids": ["N1"]}],
        }
    if tool:
        return lambda schema: filled_instance(schema, user)
    return f"(fake reply) {user[:200]}"


def make_fake(name: str) -> FakeChatModel:
    """Return a named offline fake for ``fake:NAME`` specs (servers and CLI tests).

    ``fake:memory`` writes one fact and one insight per chunk, fills any other
    schema (every field, one item per list) with a line of the dialogue it was
    shown, and echoes that line as its reply: every baseline stores something
    from the dialogue; the data generators' steps it answers as ``fake:weave``
    and ``fake:simulate`` do. Those two answer every step of the ``weave``
    (RoleMemo) and ``simulate`` (RealMem) graphs with scripted, valid content
    (:mod:`dualmem.testing.scripted`).
    """
    from dualmem.testing.scripted import SimScript, WeaveScript

    if name in {"memory", "echo", ""}:
        return FakeChatModel(responses=[_echo_memory], cycle=True)
    if name == "weave":
        return FakeChatModel(responses=[WeaveScript()], cycle=True)
    if name == "simulate":
        return FakeChatModel(responses=[SimScript()], cycle=True)
    raise ValueError(f"unknown fake model {name!r}; use fake:memory, fake:weave or fake:simulate")


def filled_instance(schema: dict[str, Any], text: str) -> Any:
    """Return a value for a JSON schema with every field set, one item per list and ``text`` in every string."""
    return minimal_instance(schema, text=text)


def minimal_instance(schema: dict[str, Any], root: dict[str, Any] | None = None, text: str | None = None) -> Any:
    """Return a small value valid for a JSON schema (required fields only; refs resolved).

    With ``text``, every field is set, lists get one item and strings are ``text``.
    """
    root = root or schema
    if "$ref" in schema:
        node: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return minimal_instance(node, root, text)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return minimal_instance(options[0], root, text)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if (
        "default" in schema
        and schema["default"] is not None
        and (text is None or schema["default"] not in ("", [], {}))
    ):
        return schema["default"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        names = list(props) if text is not None else [n for n in schema.get("required", []) if n in props]
        return {name: minimal_instance(props[name], root, text) for name in names}
    if kind == "array":
        n = max(schema.get("minItems", 0), 1 if text is not None else 0)
        return [minimal_instance(schema["items"], root, text) for _ in range(n)] if "items" in schema else []
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return max(low, 1) if schema.get("maximum", 10) >= 1 else low
    if kind == "boolean":
        return False
    if kind == "string":
        return (text if text is not None else "fake text that is long enough")[
            : schema.get("maxLength", 1000 if text else 64)
        ]
    return None


def editing_writer(messages: list[BaseMessage], tool: str | None = None) -> Any:
    """A deterministic writer that also edits what it is shown: per chunk it ADDs a fact per user turn (up to two) and
    an insight citing the first, UPDATEs a view fact and an insight and DELETEs another insight once the view holds
    three of each — which item, by a hash of the chunk text, so the same prompt always gets the same answer."""
    text = str(messages[-1].content)
    view = text.split("## WORKING MEMORY", 1)[-1].split("## CONVERSATION CHUNK", 1)[0]
    chunk = text.split("## CONVERSATION CHUNK", 1)[-1]
    facts = re.findall(r"^(F\d+)", view, re.M)
    insights = re.findall(r"^(I\d+)", view, re.M)
    turns = re.findall(r'^\[([^\]]+)\] User: "(.*)"$', chunk, re.M)
    h = int(hashlib.sha256(chunk.encode()).hexdigest()[:8], 16)
    f_ops: list[dict[str, Any]] = [
        {"op": "ADD", "id": f"N{i + 1}", "text": f"The user said {said[:80]}", "turn_ids": [tid]}
        for i, (tid, said) in enumerate(turns[:2])
    ]
    i_ops: list[dict[str, Any]] = (
        [{"op": "ADD", "id": "M1", "text": f"I read {turns[0][1][:50]} as a sign", "fact_ids": ["N1"]}] if turns else []
    )
    if len(facts) >= 3:
        f_ops.append({"op": "UPDATE", "id": facts[h % len(facts)], "text": f"Updated fact {h % 3}", "turn_ids": []})
    if len(insights) >= 3:
        i_ops.append({"op": "DELETE", "id": insights[(h // 7) % len(insights)]})
        i_ops.append(
            {
                "op": "UPDATE",
                "id": insights[(h // 3) % len(insights)],
                "text": f"Revised insight {h % 2}",
                "fact_ids": [],
            }
        )
    return {"facts": f_ops, "insights": i_ops}


def synthetic_history(sessions: int = 32, turns: int = 6) -> list[Any]:
    """Return a deterministic multi-session history whose user turns repeat words across sessions (ties to break)."""
    from dualmem.schema import Session, Turn

    words = "amber birch cobalt denim ember fjord garnet harbor indigo juniper kelp lagoon maple nutmeg opal".split()
    out = []
    for s in range(sessions):
        said = [
            Turn(
                id=f"s{s}:t{t}",
                role="user" if t % 2 == 0 else "assistant",
                text=f"I keep thinking about {' '.join(words[(s * 7 + t * 3 + k) % len(words)] for k in range(5))} today",
            )
            for t in range(turns)
        ]
        out.append(Session(id=f"s{s}", time=f"2024-{s // 28 + 1:02d}-{s % 28 + 1:02d}", turns=said))
    return out
