"""The llama.cpp engine: the GGUF run directly (``pip install 'dualmem[llamacpp]'``), prompts cut like transformers'."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from langchain_core.messages import BaseMessage

from dualmem.models.local.bundled import CONTEXT_TOKENS, bundled_gguf_path, chat_dicts, check_name, usage

END_STRINGS = ["<|im_end|>", "<|endoftext|>"]


@lru_cache(maxsize=2)
def llama(name: str) -> Any:
    """Return the llama.cpp model of the bundled GGUF (loaded once per process)."""
    # OpenMP's spinning workers livelock when another process holds a core: wait passively instead
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from llama_cpp import Llama

    check_name(name)
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1
    return Llama(
        model_path=str(bundled_gguf_path()), n_ctx=CONTEXT_TOKENS, n_threads=threads, n_batch=512, verbose=False
    )


@lru_cache(maxsize=2)
def template(name: str) -> Any:
    """Return a renderer of the GGUF's own chat template (the same prompt transformers builds)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = llama(name)

    def text(token: int) -> str:  # a special token's own text, through the public detokenizer
        return llm.detokenize([token], special=True).decode("utf-8", "ignore") if token >= 0 else ""

    bos, eos = text(llm.token_bos()), text(llm.token_eos())
    return Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"], bos_token=bos, eos_token=eos, add_generation_prompt=True
    )


def prompt(name: str, messages: list[BaseMessage], max_new_tokens: int) -> list[int]:
    """Return the prompt's tokens, cut like the transformers path: keep the start and the end."""
    chat = chat_dicts(messages)
    llm = llama(name)
    text = template(name)(messages=chat).prompt
    tokens: list[int] = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    budget = CONTEXT_TOKENS - max_new_tokens
    if len(tokens) > budget:
        head = min(256, budget // 4)
        tokens = tokens[:head] + tokens[-(budget - head) :]
    return tokens


def complete(name: str, messages: list[BaseMessage], kwargs: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """Return (text, usage) of one completion."""
    llm = llama(name)  # llama.cpp reuses the KV cache of the previous prompt's common prefix
    tokens = prompt(name, messages, kwargs["max_tokens"])
    out = llm.create_completion(prompt=tokens, **kwargs)
    counts = out.get("usage") or {}
    return out["choices"][0]["text"], usage(
        int(counts.get("prompt_tokens", len(tokens))), int(counts.get("completion_tokens", 0))
    )


def stream(name: str, messages: list[BaseMessage], kwargs: dict[str, Any], counts: dict[str, int]) -> Iterator[str]:
    """Yield the completion's text as llama.cpp produces it, then set ``counts`` to its usage."""
    llm = llama(name)
    tokens = prompt(name, messages, kwargs["max_tokens"])
    text = ""
    for part in llm.create_completion(prompt=tokens, stream=True, **kwargs):
        text += part["choices"][0]["text"]
        yield part["choices"][0]["text"]
    counts.update(usage(len(tokens), len(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))))
