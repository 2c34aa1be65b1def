"""The bundled chat model as a LangChain chat model: text, streaming, tool calls and structured output on either engine."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel, PrivateAttr, ValidationError

import dualmem.models.local.llamacpp as llamacpp
from dualmem.models.local.bundled import (
    CONTEXT_TOKENS,
    LOCAL_MODELS,
    chat_dicts,
    check_name,
    load_transformers,
    resolve_engine,
    stop_ids,
    usage,
)
from dualmem.models.local.grammar import grammar_factory


class LocalChatModel(BaseChatModel):
    """A LangChain chat model running a bundled transformers model on CPU."""

    name_: str = "smollm2"
    engine: str = "transformers"
    temperature: float = 0.0
    max_new_tokens: int = 512
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "dualmem-local"

    @property
    def model_name(self) -> str:
        """Return the model's human name."""
        return f"local:{self.name_} ({LOCAL_MODELS.get(self.name_, 'SmolLM2-135M-Instruct + LoRA')}, {self.engine})"

    def _adapter(self) -> bool:
        """Whether this is a trained LoRA writer: it was trained on the plain prompt, so no schema hint and no repetition penalty."""
        return self.name_ not in LOCAL_MODELS

    def _constrained(self) -> bool:
        """Whether structured answers are decoded under a grammar (else parsed loosely and repaired)."""
        return importlib.util.find_spec("xgrammar") is not None

    def _encode(self, messages: list[BaseMessage]) -> Any:
        _, tok = load_transformers(self.name_)
        enc = tok.apply_chat_template(
            chat_dicts(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        budget = CONTEXT_TOKENS - self.max_new_tokens
        if enc["input_ids"].shape[1] > budget:  # keep the start (system prompt) and the end
            import torch

            ids = enc["input_ids"]
            head = min(256, budget // 4)
            ids = torch.cat([ids[:, :head], ids[:, -(budget - head) :]], dim=1)
            enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return enc

    def _gen_kwargs(self, stop: list[str] | None, **extra: Any) -> dict[str, Any]:
        _, tok = load_transformers(self.name_)
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": tok.eos_token_id,
            "repetition_penalty": 1.0
            if self._adapter()
            else 1.15,  # the penalty also hits the prompt: a trained writer copies from it
            "eos_token_id": stop_ids(tok),
        }
        if self.temperature > 0:
            kwargs.update(do_sample=True, temperature=self.temperature, top_p=0.95)
        else:
            kwargs.update(do_sample=False)
        if stop:
            kwargs["stop_strings"], kwargs["tokenizer"] = stop, tok
        kwargs.update(extra)
        return kwargs

    def _run(
        self, messages: list[BaseMessage], stop: list[str] | None = None, schema_json: str | None = None
    ) -> tuple[str, dict[str, int]]:
        """Generate one answer, under the JSON-schema grammar ``schema_json`` when given; return (text, usage)."""
        if self.engine == "llama.cpp":
            with self._lock:
                return llamacpp.complete(self.name_, messages, self._llama_kwargs(stop, schema_json))
        import torch

        model, tok = load_transformers(self.name_)
        enc = self._encode(messages)
        factory = grammar_factory(self.name_, schema_json, self.max_new_tokens, "transformers") if schema_json else None
        extra = {"logits_processor": [factory()]} if factory else {}
        with self._lock, torch.inference_mode():
            out = model.generate(**enc, **self._gen_kwargs(stop, **extra))
        new = out[0][enc["input_ids"].shape[1] :]
        return tok.decode(new, skip_special_tokens=True), usage(int(enc["input_ids"].shape[1]), int(new.shape[0]))

    def _llama_kwargs(self, stop: list[str] | None, schema_json: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": 0.95 if self.temperature > 0 else 1.0,
            "repeat_penalty": 1.0 if self._adapter() else 1.15,  # as on transformers: a trained writer copies
            "stop": [*llamacpp.END_STRINGS, *(stop or [])],
        }
        factory = grammar_factory(self.name_, schema_json, self.max_new_tokens, "llama.cpp") if schema_json else None
        if factory:
            from llama_cpp import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList([factory()])
        return kwargs

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        """Return a binding (``.bound`` is this model, as LangChain's models do) that answers with tool calls.

        The calls are decoded under a grammar of the tools' schemas. ``tool_choice``: a tool's name (or
        ``{"type": "function", "function": {"name": ...}}``) restricts the calls to that tool; ``"none"``
        answers in text; anything else (``None``, ``"auto"``, ``"any"``, ``"required"``) makes at least one call.
        """
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], tool_choice=tool_choice, **kwargs)

    def _tool_calls(
        self, messages: list[BaseMessage], tools: list[dict[str, Any]], tool_choice: Any = None
    ) -> AIMessage:
        """Generate tool calls as JSON constrained to ``tools`` (OpenAI tool dicts)."""
        functions = [t["function"] for t in tools]
        chosen = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else tool_choice
        if isinstance(chosen, str) and chosen in {f["name"] for f in functions}:
            functions = [f for f in functions if f["name"] == chosen]
        call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [f["name"]]},
                        "arguments": f.get("parameters") or {"type": "object"},
                    },
                    "required": ["name", "arguments"],
                }
                for f in functions
            ]
        }
        schema = {
            "type": "object",
            "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
            "required": ["tool_calls"],
        }
        listing = "\n".join(
            f"- {f['name']}: {f.get('description', '')} arguments schema {json.dumps(f.get('parameters', {}))}"
            for f in functions
        )
        hint = f'Call one or more of these tools. Answer with JSON {{"tool_calls": [{{"name": ..., "arguments": {{...}}}}]}}.\n{listing}'
        messages = _with_hint(messages, hint)
        constrained = self._constrained()
        text, usage = self._run(messages, None, json.dumps(schema))
        try:
            calls = (json.loads(text) if constrained else _loose_json(text)).get("tool_calls", [])
        except (ValueError, AttributeError):
            return self._answer(text, usage)
        tool_calls = [
            {"name": c.get("name", ""), "args": c.get("arguments") or {}, "id": f"call_{i}", "type": "tool_call"}
            for i, c in enumerate(calls)
            if isinstance(c, dict)
        ]
        return self._answer("", usage, tool_calls=tool_calls)

    def _capped(self, kwargs: dict[str, Any]) -> LocalChatModel:
        """Return this model, or a copy generating at most the call's ``max_tokens`` (as ``.bind(max_tokens=N)`` asks)."""
        limit = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
        if not limit or int(limit) >= self.max_new_tokens:
            return self
        return self.model_copy(update={"max_new_tokens": max(1, int(limit))})  # shares the engine lock

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model = self._capped(kwargs)
        if (request := _tool_request(kwargs)) is not None:
            return ChatResult(generations=[ChatGeneration(message=model._tool_calls(messages, *request))])
        if (schema := _schema_request(kwargs)) is not None:
            return ChatResult(generations=[ChatGeneration(message=model._in_schema(messages, schema))])
        text, usage = model._run(messages, stop)
        return ChatResult(generations=[ChatGeneration(message=model._answer(text, usage))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        model = self._capped(kwargs)
        if (request := _tool_request(kwargs)) is not None:  # tool calls come whole, as one chunk
            message = model._tool_calls(messages, *request)
            calls = [
                {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
                for i, c in enumerate(message.tool_calls)
            ]
            yield _whole(message, tool_call_chunks=calls)
            return
        if (schema := _schema_request(kwargs)) is not None:  # a structured answer comes whole, as one chunk
            yield _whole(model._in_schema(messages, schema))
            return
        counts: dict[str, int] = {}
        for piece in model._pieces(messages, stop, counts):
            if piece:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                if run_manager:
                    run_manager.on_llm_new_token(piece, chunk=chunk)
                yield chunk
        yield _whole(self._answer("", counts))  # the call's usage and model, once (merged chunks add metadata up)

    def _pieces(self, messages: list[BaseMessage], stop: list[str] | None, counts: dict[str, int]) -> Iterator[str]:
        """Yield the answer's text as the engine produces it, then set ``counts`` to the call's usage."""
        if self.engine == "llama.cpp":
            with self._lock:
                yield from llamacpp.stream(self.name_, messages, self._llama_kwargs(stop), counts)
            return
        import torch
        from transformers import TextIteratorStreamer

        model, tok = load_transformers(self.name_)
        enc = self._encode(messages)
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)

        prompt = int(enc["input_ids"].shape[1])

        def work() -> None:
            with self._lock, torch.inference_mode():
                out = model.generate(**enc, **self._gen_kwargs(stop, streamer=streamer))
            counts.update(usage(prompt, int(out.shape[1]) - prompt))

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        yield from streamer
        thread.join()

    def _answer(self, content: str, counts: dict[str, int], **more: Any) -> AIMessage:
        """Return an answer with its usage and this model's name (LangChain's usage callback keys usage by it)."""
        return AIMessage(
            content=content,
            usage_metadata=counts or None,  # type: ignore[arg-type]
            response_metadata={"model_name": self.model_name},
            **more,
        )

    def _in_schema(self, messages: list[BaseMessage], schema: dict[str, Any]) -> AIMessage:
        """Generate an answer constrained to the JSON ``schema`` (a grammar where xgrammar is installed)."""
        if not self._adapter():  # an adapter saw the writer's exact prompt in training, without the hint
            messages = _with_hint(messages, "Answer with one JSON object matching this schema:\n" + json.dumps(schema))
        text, usage = self._run(messages, None, json.dumps(schema))
        return self._answer(text, usage)

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kwargs: Any) -> Runnable:  # type: ignore[override]
        """Return this model bound to ``schema`` (OpenAI's ``response_format``), then a parser of its answer.

        The generation is a call of this chat model, so callbacks, tracing and usage counters see it as any other.
        """
        json_schema = convert_to_json_schema(schema)
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        constrained = self._constrained()
        bound = self.bind(
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": json_schema}},
            ls_structured_output_format={"kwargs": {"method": "json_schema"}, "schema": json_schema},
        )

        def parse(raw: AIMessage) -> Any:
            parsed, error = None, None
            try:
                data = json.loads(str(raw.content)) if constrained else _loose_json(str(raw.content))
                parsed = schema.model_validate(data) if is_model else data
            except (ValueError, ValidationError) as exc:
                error = exc
            if include_raw:
                return {"raw": raw, "parsed": parsed, "parsing_error": error}
            if error:
                raise error
            return parsed

        return bound | RunnableLambda(parse, name="LocalStructuredOutput")


def _loose_json(text: str) -> Any:
    from dualmem.models.structured import extract_json

    return extract_json(text)


def _with_hint(messages: list[BaseMessage], hint: str) -> list[BaseMessage]:
    """Return ``messages`` with ``hint`` added to the last one (none: unchanged)."""
    if not messages:
        return messages
    return [*messages[:-1], messages[-1].model_copy(update={"content": f"{messages[-1].content}\n\n{hint}"})]


def _whole(message: AIMessage, **more: Any) -> ChatGenerationChunk:
    """Return ``message`` as one stream chunk, its usage and metadata kept."""
    return ChatGenerationChunk(
        message=AIMessageChunk(
            content=message.content,
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            **more,
        )
    )


def _schema_request(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Return the JSON schema of a call bound to ``response_format={"type": "json_schema", ...}``, else None."""
    fmt = kwargs.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return fmt.get("json_schema", {}).get("schema") or {"type": "object"}
    return None


def _tool_request(kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], Any] | None:
    """Return ``(tools, tool_choice)`` when the call was bound to tools that may be called, else None."""
    tools, tool_choice = kwargs.get("tools"), kwargs.get("tool_choice")
    return (tools, tool_choice) if tools and tool_choice != "none" else None


def load_local_chat_model(
    name: str, *, temperature: float = 0.0, max_new_tokens: int = 512, engine: str = "auto"
) -> LocalChatModel:
    """Return the bundled local chat model ``name`` on ``engine`` (auto, llama.cpp, transformers).

    ``name``: ``smollm2``, ``smollm2-writer`` (SmolLM2 with the shipped writer LoRA) or the folder of a LoRA adapter of SmolLM2.
    """
    check_name(name)
    return LocalChatModel(
        name_=name, engine=resolve_engine(engine, name), temperature=temperature, max_new_tokens=max_new_tokens
    )
