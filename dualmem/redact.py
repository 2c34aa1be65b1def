"""No credential in any artifact: what counts as a secret, and how settings, URLs and text are shown without it.

Everything DualMem writes or shows about a run's settings — ``run.json``, summaries, reports, the run record, the
reproducibility record, LangSmith metadata, exports, logs and error messages — passes through here:

- :func:`redact_settings`: ``openai_api_key`` is dropped; ``store_options`` keeps its keys with credential values
  replaced by :data:`MASK`; URLs lose their ``user:password@`` and credential query parameters;
- :func:`scrub`: every secret this process knows (credential settings, credential-named environment variables) is
  replaced by :data:`MASK` in a text, for messages and logs built from values the code does not control.

>>> public_url("https://bob:hunter2@example.org/v1?api_key=abc&x=1")
'https://example.org/v1?api_key=***&x=1'
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

MASK = "***"
DROPPED = frozenset({"openai_api_key"})
"""Settings never recorded at all (a resumed run reads them from its environment)."""
CREDENTIAL_SETTINGS = frozenset({"openai_api_key", "store_options"})
"""Settings that carry or may carry credentials: a recorded run never restores them from its files."""
URL_SETTINGS = frozenset({"openai_base_url", "store_uri", "formation_url", "ray_address"})
_SECRET_NAME = re.compile(
    r"(key|token(?!s\b)|secret|passw(or)?d|credential|signature|auth|cookie|private)", re.IGNORECASE
)
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_QUERY_SECRET = re.compile(r"(?i)([?&][^=&#\s]*(?:key|token|secret|sig|signature|password|auth)[^=&#\s]*=)[^&#\s]*")


def is_secret_name(name: str) -> bool:
    """Return whether a setting, option or environment variable name says it holds a credential."""
    return bool(_SECRET_NAME.search(name))


def public_url(url: str) -> str:
    """Return ``url`` without the user and password it may carry and with credential query values masked."""
    if not isinstance(url, str) or not url:
        return url
    return _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, _USERINFO.sub("", url))


def redact_options(raw: Any) -> Any:
    """Return storage options (a JSON object or its text) with every credential-named value masked."""
    data = raw
    if isinstance(raw, str):
        if not raw.strip():
            return raw
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            return MASK  # unreadable: shown as a whole secret
    if not isinstance(data, dict):
        return MASK
    out = {k: (MASK if is_secret_name(str(k)) else public_url(v) if isinstance(v, str) else v) for k, v in data.items()}
    return json.dumps(out, sort_keys=True) if isinstance(raw, str) else out


def redact_settings(values: dict[str, Any]) -> dict[str, Any]:
    """Return a settings mapping (field -> value) as it may be written or shown: no credential left."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in DROPPED:
            continue
        if name == "store_options":
            out[name] = redact_options(value)
        elif name in URL_SETTINGS or (isinstance(value, str) and "://" in value):
            out[name] = public_url(value)
        elif is_secret_name(name) and value:
            out[name] = MASK
        else:
            out[name] = value
    return out


def known_secrets(settings: Any = None, environ: dict[str, str] | None = None) -> set[str]:
    """Return the secret strings this process knows: credential settings and credential-named environment variables.

    Values shorter than 6 characters are left out (masking them would garble ordinary text).
    """
    env = os.environ if environ is None else environ
    found: set[str] = set()

    def add(value: Any) -> None:
        if isinstance(value, str) and len(value) >= 6:
            found.add(value)

    for name, value in env.items():
        if is_secret_name(name) or (name.upper().endswith("TOKENS") and not value.strip().isdigit()):
            add(value)
            for key, inner in (_json_object(value) or {}).items():  # a token table: its keys are the tokens
                add(str(key))
                add(inner if isinstance(inner, str) else "")
        else:
            for key, inner in (_json_object(value) or {}).items():  # storage options: their credential values
                if is_secret_name(str(key)):
                    add(str(inner))
        if "://" in value:
            add(_password(value))
    if settings is not None:
        add(getattr(settings, "openai_api_key", ""))
        for name in URL_SETTINGS:
            add(_password(str(getattr(settings, name, "") or "")))
        options = getattr(settings, "store_options", "")
        for key, value in (_json_object(options) or {}).items():
            if is_secret_name(str(key)):
                add(str(value))
    return found


def scrub(text: str, settings: Any = None) -> str:
    """Return ``text`` with every known secret (see :func:`known_secrets`) and URL password masked."""
    if not text:
        return text
    out = public_url(text) if "://" in text else text
    for secret in sorted(known_secrets(settings), key=len, reverse=True):
        out = out.replace(secret, MASK)
    return out


def _password(url: str) -> str:
    m = re.search(r"://[^/@\s:]*:([^/@\s]+)@", url)
    return m.group(1) if m else ""


def _json_object(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, dict):
        return raw
    try:
        data = json.loads(raw) if isinstance(raw, str) and raw.strip().startswith("{") else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def public_error(exc: BaseException) -> str:
    """Return what a remote caller (MCP, the memory browser) is told of a failure: never another user, persona, a
    server path or a secret (the full message goes to the server's log)."""
    import logging

    from dualmem.errors import LeaseTimeout

    text = str(exc)
    if isinstance(exc, PermissionError):  # AccessDenied: its message names no one else
        return text
    if isinstance(exc, LeaseTimeout):
        return "a writer is writing this memory now; try again shortly"
    if text.startswith("nothing stored"):
        return "nothing is stored for this persona and user"
    if text.startswith("no item"):
        return "no memory with that id in this persona's memory of this user"
    logging.getLogger("dualmem").warning("request failed: %s", scrub(text))
    return f"the request failed ({type(exc).__name__}); the server log has the details"
