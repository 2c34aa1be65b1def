"""Token counting offline, with the bundled embedder's tokenizer (no downloads)."""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

_LOADING = threading.Lock()


def _tokenizer() -> Any:
    """Return the process's tokenizer, loaded once: threads asking at once (an evaluation's first units) wait for the
    first load instead of each loading it."""
    with _LOADING:
        return _load_tokenizer()


@lru_cache(maxsize=1)
def _load_tokenizer() -> Any:
    from tokenizers import Tokenizer

    from dualmem.models.local.bundled import bundled_embedder_path

    tok = Tokenizer.from_file(str(bundled_embedder_path() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def count_tokens(text: str) -> int:
    """Return the number of tokens of ``text`` (WordPiece of all-MiniLM-L6-v2).

    Falls back to a word/punctuation count when the bundled tokenizer is absent.
    """
    if not text:
        return 0
    try:
        tok = _tokenizer()
    except Exception:  # noqa: BLE001 - the package is optional for counting
        return len(re.findall(r"\w+|[^\w\s]", text))
    return len(tok.encode(text, add_special_tokens=False).ids)


def count_tokens_batch(texts: list[str]) -> list[int]:
    """Return token counts of many texts at once (fast path for long histories)."""
    try:
        tok = _tokenizer()
    except Exception:  # noqa: BLE001
        return [count_tokens(t) for t in texts]
    return [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]
