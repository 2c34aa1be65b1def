"""JSON-schema grammars for the bundled model: bounds that fit the token budget, xgrammar processors for both engines."""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from typing import Any

from dualmem.models.local.bundled import load_transformers, stop_ids

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


def bound(node: Any, max_string: int = MAX_STRING, max_items: int = MAX_ITEMS) -> Any:
    """Cap string lengths and list sizes so a tiny model cannot ramble past its token budget."""
    if isinstance(node, dict):
        out = {k: bound(v, max_string, max_items) for k, v in node.items()}
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
        return [bound(v, max_string, max_items) for v in node]
    return node


class LlamaGrammarProcessor:
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


def compile_grammar(tok: Any, vocab_size: int, schema_json: str, max_new_tokens: int = 512) -> Any:
    """Return ``schema_json`` compiled by xgrammar for ``tok``, bounded to fit ``max_new_tokens`` (None without xgrammar).

    Decoding stops on any of the tokenizer's end-of-turn tokens (:func:`~dualmem.models.local.bundled.stop_ids`).
    """
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size, stop_token_ids=stop_ids(tok))
    return compile_for(info, schema_json, max_new_tokens)


def compile_for(info: Any, schema_json: str, max_new_tokens: int = 512) -> Any:
    """Return ``schema_json`` compiled by xgrammar for the vocabulary ``info`` (an ``xgrammar.TokenizerInfo``),
    bounded to fit ``max_new_tokens``."""
    import xgrammar as xgr

    bounded = json.dumps(bound(json.loads(schema_json), *grammar_bounds(max_new_tokens)))
    return xgr.GrammarCompiler(info).compile_json_schema(bounded, any_whitespace=False)


@lru_cache(maxsize=16)
def grammar_factory(name: str, schema_json: str, max_new_tokens: int = 512, engine: str = "transformers") -> Any:
    """Return a zero-arg factory of fresh xgrammar logits processors (None without xgrammar)."""
    if importlib.util.find_spec("xgrammar") is None:
        return None
    if engine == "llama.cpp":  # llama.cpp's own vocabulary: no weights de-quantised, no tokenizer converted
        from dualmem.models.local.llamacpp import llama, tokenizer_info

        compiled = compile_for(tokenizer_info(name), schema_json, max_new_tokens)
        end = llama(name).token_eos()
        return lambda: LlamaGrammarProcessor(compiled, end)
    model, tok = load_transformers(name)
    compiled = compile_grammar(tok, model.config.vocab_size, schema_json, max_new_tokens)
    if compiled is None:
        return None
    from xgrammar.contrib.hf import LogitsProcessor

    return lambda: LogitsProcessor(compiled)
