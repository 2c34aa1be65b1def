"""Whose memory a call reaches: the one rule for every path, and the LangGraph server's authorization handlers.

**The rule** (:func:`whose_memory`), used by the write and respond graphs, the chat
middleware, the memory tools and retriever inside a run, the MCP server, the
memory browser and the CLI:

1. On a LangGraph server with authentication (or any caller that passes an
   identity, such as the MCP server with tokens), the user is the authenticated
   identity. A user named by the client — the run's context ``user_id``,
   ``config["configurable"]["user_id"]``, the second part of an input
   ``namespace``, a tool argument — that differs is refused with
   :class:`AccessDenied`. An identity holding :data:`ADMIN_PERMISSION` may name
   any user (maintenance, support, forget on request).
2. Without authentication (local use, ``langgraph dev`` without an ``auth``
   entry), a user named by the caller; several different names are an error.
3. Else the ``user_id`` setting when it is set (``DUALMEM_USER_ID``,
   ``Settings(user_id=...)``, ``--user``).
4. Else, for a reader that passes the persona's ``users`` with memory: the
   persona's only user; several is a one-line error listing them.
5. Else :data:`~dualmem.config.DEFAULT_USER`.

**The handlers** (:func:`protect`) make the server's own APIs follow the same
rule: threads, runs, crons and assistants belong to their creator; store items
only in the caller's namespaces (see :func:`owns_namespace`).

>>> whose_memory(claimed=["theo"])
'theo'
>>> whose_memory(identity="alice", claimed=["alice", None])
'alice'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dualmem.config import DEFAULT_USER, Settings
from dualmem.errors import DualMemError
from dualmem.schema import check_id

ADMIN_PERMISSION = "dualmem:admin"
"""A permission (in the ``permissions`` your ``@auth.authenticate`` handler returns) that may name any user."""
MEMORY_LABEL = (
    "dualmem"  # the first part of the LangGraph store's memory namespaces (``memory_label`` setting's default)
)


class AccessDenied(DualMemError, PermissionError):
    """The caller asked for memory, threads or store items that are not theirs (the message names no other user)."""


# --------------------------------------------------------------------------- who is asking


def run_configurable() -> dict[str, Any]:
    """Return the current graph run's ``configurable`` ({} outside a run)."""
    from langgraph.config import get_config

    try:
        return dict(get_config().get("configurable") or {})
    except RuntimeError:  # outside a graph run
        return {}


def _permissions(user: Any, configurable: Mapping[str, Any]) -> list[str]:
    perms = configurable.get("langgraph_auth_permissions")
    if perms is None:
        try:
            perms = getattr(user, "permissions", None)
        except (AttributeError, KeyError):
            perms = None
    if perms is None and isinstance(user, Mapping):
        perms = user.get("permissions")
    return [str(p) for p in perms or ()]


def server_identity(runtime: Any = None) -> tuple[str | None, bool]:
    """Return (identity, is administrator) of the LangGraph server's authenticated user of this run, else (None, False).

    Read from ``runtime.server_info.user``, else the run's ``configurable["langgraph_auth_user"]`` (both set by the
    server only; a client cannot set them). Unauthenticated runs (no ``auth`` entry) have no identity.
    """
    configurable = run_configurable()
    info = getattr(runtime, "server_info", None)
    user = getattr(info, "user", None) if info is not None else None
    if user is None:
        user = configurable.get("langgraph_auth_user")
    if user is None:
        return None, False
    identity = user.get("identity") if isinstance(user, Mapping) else getattr(user, "identity", None)
    if not identity:
        return None, False
    return str(identity), ADMIN_PERMISSION in _permissions(user, configurable) or _is_studio(user)


def _is_studio(user: Any) -> bool:
    """Return whether the user is LangGraph Studio's (the deployment's developer, as LangGraph's own rules treat it)."""
    from langgraph_sdk.auth.types import StudioUser

    kind = user.get("kind") if isinstance(user, Mapping) else None
    return isinstance(user, StudioUser) or kind == "StudioUser"


def run_claims(runtime: Any = None) -> list[str | None]:
    """Return the users a run's caller named: the context's ``user_id`` (field, or in ``options``) and configurable's."""
    context = getattr(runtime, "context", None)
    claims = [lookup(context, "user_id")]
    options = lookup(context, "options")
    if isinstance(options, Mapping):
        claims.append(options.get("user_id"))
    claims.append(run_configurable().get("user_id"))
    return claims


def lookup(holder: Any, key: str) -> Any:
    """Return ``key`` of a context (a dict or an object), None when absent."""
    if holder is None:
        return None
    if isinstance(holder, Mapping):
        return holder.get(key)
    return getattr(holder, key, None)


# --------------------------------------------------------------------------- the rule


def whose_memory(
    runtime: Any = None,
    *,
    claimed: Iterable[str | None] = (),
    settings: Settings | None = None,
    users: Sequence[str] | Callable[[], Sequence[str]] | None = None,
    persona_id: str = "",
    identity: str | None = None,
    admin: bool = False,
) -> str:
    """Return whose memory a call reads or writes — the one rule of the module docstring.

    ``runtime``: a graph runtime (its server identity and the caller's claims are read from it); ``claimed``: users
    the caller named elsewhere (an input namespace, an argument); ``identity``/``admin``: an identity authenticated
    outside LangGraph (MCP tokens); ``users``: the persona's users with memory, for readers (the "only user" rule).
    """
    if identity is None:
        identity, admin = server_identity(runtime)
    named = {str(c) for c in [*claimed, *(run_claims(runtime) if runtime is not None else [])] if c}
    if identity is not None:
        if not named or admin and len(named) == 1:
            user = named.pop() if named else identity
            return check_id(user, "user id")
        if named != {identity}:
            raise AccessDenied(
                f"you are authenticated as {identity!r}: this memory belongs to another user; leave the user id out "
                "(your identity is used) or name your own"
            )
        return check_id(identity, "user id")
    if len(named) > 1:
        raise AccessDenied(f"two different users were named for one call ({', '.join(sorted(named))}); name one")
    if named:
        return check_id(named.pop(), "user id")
    s = settings if settings is not None else Settings()
    if s.user_id:
        return check_id(s.user_id, "user id")
    if users is not None:
        found = sorted(users() if callable(users) else users)
        if len(found) > 1:
            from dualmem.errors import ConfigurationError

            raise ConfigurationError(
                f"persona {persona_id!r} has memory of several users ({', '.join(found)}); name one (--user, user=)"
            )
        if found:
            return found[0]
    return DEFAULT_USER


def authorize_namespace(namespace: Sequence[str], runtime: Any = None) -> tuple[str, ...]:
    """Return ``namespace`` (persona, user, …) when the run's authenticated user may reach it, else raise AccessDenied.

    Outside an authenticated run every namespace passes (local use).
    """
    ns = tuple(str(p) for p in namespace)
    if len(ns) >= 2:
        whose_memory(runtime, claimed=[ns[1]])
    return ns


# --------------------------------------------------------------------------- tokens (MCP over HTTP, the memory browser)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKENS_ENV = "DUALMEM_TOKENS"


@dataclass(frozen=True)
class TokenUser:
    """Who a bearer token stands for."""

    identity: str
    permissions: tuple[str, ...] = ()

    @property
    def admin(self) -> bool:
        """Return whether this identity may name any user (:data:`ADMIN_PERMISSION`)."""
        return ADMIN_PERMISSION in self.permissions


class TokenTable:
    """Bearer tokens of a small deployment: ``{token: identity | {"identity", "permissions"}}`` (tokens of 8+
    characters, compared in constant time). The MCP server and the memory browser take one with ``--tokens FILE``
    or the ``DUALMEM_TOKENS`` environment variable (JSON)."""

    def __init__(self, table: Mapping[str, Any]) -> None:
        from dualmem.errors import ConfigurationError

        self.users: dict[str, TokenUser] = {}
        for token, who in table.items():
            identity = who.get("identity") if isinstance(who, Mapping) else who
            perms = who.get("permissions", []) if isinstance(who, Mapping) else []
            if not isinstance(token, str) or len(token) < 8 or not isinstance(identity, str) or not identity:
                raise ConfigurationError(
                    'tokens: each entry is "TOKEN": "identity" (or {"identity", "permissions"}) with a token of 8+ '
                    "characters"
                )
            self.users[token] = TokenUser(check_id(identity, "identity"), tuple(str(p) for p in perms))

    def lookup(self, token: str | None) -> TokenUser | None:
        """Return the user of ``token``, None for an unknown or missing one (every entry compared)."""
        import hmac

        found = None
        for known, user in self.users.items():
            if hmac.compare_digest(known.encode(), (token or "").encode()):
                found = user
        return found


def load_tokens(path: str | None = None) -> TokenTable | None:
    """Return the token table of ``path`` (a JSON file), else of ``DUALMEM_TOKENS`` (JSON), else None (no auth)."""
    import json
    import os
    from pathlib import Path

    from dualmem.errors import ConfigurationError

    if path:
        if not Path(path).is_file():
            raise ConfigurationError(f"--tokens {path}: no such file (a JSON object of token -> identity)")
        source, text = f"--tokens {path}", Path(path).read_text()
    else:
        source, text = TOKENS_ENV, os.environ.get(TOKENS_ENV) or ""
        if not text:
            return None
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{source}: not JSON ({exc.msg}); give an object of token -> identity") from None
    if not isinstance(table, dict) or not table:
        raise ConfigurationError(f"{source}: give a non-empty JSON object of token -> identity")
    return TokenTable(table)


def check_exposure(host: str, tokens: TokenTable | None, fix: str) -> None:
    """Refuse to serve beyond loopback without authentication (one line naming ``fix``)."""
    from dualmem.errors import ConfigurationError

    if host not in LOOPBACK and tokens is None:
        raise ConfigurationError(
            f"--host {host} without authentication would let anyone who reaches this port read and forget every "
            f"user's memory: pass {fix}, or serve on 127.0.0.1"
        )


# --------------------------------------------------------------------------- LangGraph server authorization


def owns_namespace(namespace: Sequence[str] | None, identity: str, label: str = MEMORY_LABEL) -> bool:
    """Return whether a store namespace (or search prefix) is the caller's own.

    - DualMem's memory and pending chat turns: ``(label, persona, identity, …)`` and ``(label + "_pending", persona,
      identity, …)`` — the persona and the caller's own user pinned;
    - an application's: ``(identity, …)`` — the caller's identity first (LangGraph's documented convention).

    A prefix that pins no user (``()``, ``(label,)``, ``(label, persona)``) reaches other users' items: not owned.

    >>> owns_namespace(("dualmem", "mara", "alice", "fact"), "alice"), owns_namespace(("dualmem", "mara"), "alice")
    (True, False)
    """
    ns = tuple(namespace or ())
    if not ns:
        return False
    if ns[0] in (label, f"{label}_pending"):
        return len(ns) >= 3 and ns[2] == identity
    return ns[0] == identity


def protect(auth: Any, *, label: str = MEMORY_LABEL, admin_permission: str = ADMIN_PERMISSION) -> Any:
    """Add DualMem's authorization handlers to a ``langgraph_sdk.Auth`` that already authenticates; return it.

    - threads, runs (through their thread) and crons: the creator is recorded as ``metadata.owner`` (a client cannot
      set another) and every read, update, delete, search or run is filtered to the caller's own;
    - assistants: the creator owns the ones they create; everyone reads the graphs' own (``created_by: system``);
    - store: every operation must stay in the caller's namespaces (:func:`owns_namespace`), else 403;
    - an identity holding ``admin_permission`` passes every check (maintenance, forget on request), and so does
      LangGraph Studio's user (the deployment's developer, authenticated by LangSmith or ``langgraph dev``).

    Each handler is registered for a resource (``@auth.on.threads``, …): a resource you already handle is an error
    naming it, so no rule is silently replaced.
    """
    from langgraph_sdk import Auth

    from dualmem.errors import ConfigurationError

    def is_admin(ctx: Any) -> bool:
        return admin_permission in list(getattr(ctx, "permissions", None) or ()) or _is_studio(ctx.user)

    def owned(ctx: Any, value: Any) -> dict[str, Any] | None:
        if is_admin(ctx):
            return None
        identity = ctx.user.identity
        if isinstance(value, dict) and ctx.action in ("create", "update", "create_run"):
            metadata = value.get("metadata")
            if not isinstance(metadata, dict):
                metadata = {}
                value["metadata"] = metadata
            metadata["owner"] = identity
        return {"owner": identity}

    async def threads(ctx: Auth.types.AuthContext, value: Any) -> Any:
        return owned(ctx, value)

    async def crons(ctx: Auth.types.AuthContext, value: Any) -> Any:
        return owned(ctx, value)

    async def assistants(ctx: Auth.types.AuthContext, value: Any) -> Any:
        if is_admin(ctx):
            return None
        own = owned(ctx, value)
        if ctx.action in ("read", "search"):
            return {"$or": [own, {"created_by": "system"}]}
        return own

    async def store(ctx: Auth.types.AuthContext, value: Any) -> Any:
        if is_admin(ctx):
            return None
        if not owns_namespace(value.get("namespace"), ctx.user.identity, label):
            raise Auth.exceptions.HTTPException(
                status_code=403,
                detail=f"store namespaces are yours only: ({label!r}, persona, your id, …) or (your id, …)",
            )
        return None

    try:
        auth.on.threads(threads)
        auth.on.crons(crons)
        auth.on.assistants(assistants)
        auth.on.store()(store)
    except ValueError as exc:
        raise ConfigurationError(
            f"dualmem.auth.protect: {exc} — remove your own handler for that resource, or leave protect() out and "
            "write every handler yourself"
        ) from exc
    return auth


__all__ = [
    "ADMIN_PERMISSION",
    "AccessDenied",
    "TokenTable",
    "TokenUser",
    "check_exposure",
    "load_tokens",
    "authorize_namespace",
    "owns_namespace",
    "protect",
    "server_identity",
    "whose_memory",
]
