"""DualMem's memory as MCP tools, served with the official ``mcp`` SDK (FastMCP) over stdio or streamable HTTP.

Tools: ``search_memory`` (facts and insights, ranked by the one retrieval
path: :class:`~dualmem.retrieval.pipeline.Ranker`), ``add_fact``, ``forget``
(one item, or with ``everything`` the whole user: :mod:`~dualmem.control.forget`)
and ``memory_history`` (:mod:`~dualmem.control.history`).

**Authentication (HTTP).** With a token table (``--tokens FILE`` or the
``DUALMEM_TOKENS`` environment variable: a JSON object ``{token: identity}``
or ``{token: {"identity": ..., "permissions": [...]}}``) every request needs
``Authorization: Bearer <token>`` (the SDK's bearer-token middleware, with this
table as its token verifier); the user of every call is then the token's
identity, by the one rule of :func:`dualmem.auth.whose_memory` (a call or header
naming another user is refused; ``dualmem:admin`` may name any). A non-loopback
``--host`` without tokens is refused; DNS-rebinding protection is always on,
for the loopback names and the ``--host`` (plus ``allowed_hosts``).

**Scope.** Every call acts on exactly one namespace ``(persona, user)``, taken from:

1. the server's own scope (``dualmem mcp --persona P --user U``): every connection is pinned to it;
2. else the connection's: HTTP headers ``X-DualMem-Persona`` / ``X-DualMem-User``, or the
   URL's ``?persona=…&user=…``; with tokens, the user is the token's identity;
3. else the call's ``persona`` and ``user`` arguments.

An MCP session keeps the token and scope it was initialized with: a later
request of the session with another token, header or URL scope is refused (403)
before it reaches a tool. Errors name no other user, persona or server path.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from dualmem.auth import ADMIN_PERMISSION, TokenTable, check_exposure
from dualmem.errors import ConfigurationError, DualMemError
from dualmem.redact import public_error
from dualmem.schema import MemoryKind

try:
    from mcp.server.fastmcp import Context, FastMCP
except ImportError as exc:  # pragma: no cover - the extra is a dev dependency
    raise ConfigurationError("serving MCP needs the mcp package: pip install 'dualmem[mcp]'") from exc

T = TypeVar("T")
log = logging.getLogger("dualmem.mcp")
HEADERS = ("x-dualmem-persona", "x-dualmem-user")
SESSION_HEADER = "mcp-session-id"
INSTRUCTIONS = (
    "Long-term memory of a role-playing persona about one user: facts the user revealed and the persona's insights "
    "(its interpretations, citing facts). Search before answering about the user's life; add a fact when the user "
    "reveals something worth remembering; forget only when the user asks."
)


@dataclass(frozen=True)
class Scope:
    """A (persona, user) scope: parts left None are chosen per connection or per call."""

    persona: str | None = None
    user: str | None = None


PersonaArg = Annotated[str | None, Field(description="persona id; leave empty when the connection is scoped to one")]
UserArg = Annotated[str | None, Field(description="user id; leave empty when the connection is scoped to one")]
Kind = Literal["both", "fact", "insight"]


class Scoper:
    """Resolve each call's namespace from the server scope, the connection (token, headers, URL) and the call."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def connection(self, ctx: Any) -> Scope:
        """Return the scope a call's connection is pinned to (server scope over HTTP headers and URL)."""
        request = getattr(getattr(ctx, "request_context", None), "request", None) if ctx is not None else None
        persona, user = self.scope.persona, self.scope.user
        if request is not None:
            headers, query = request.headers, request.query_params
            persona = persona or headers.get(HEADERS[0]) or query.get("persona")
            user = user or headers.get(HEADERS[1]) or query.get("user")
        return Scope(persona, user)

    def namespace(self, ctx: Any, persona: str | None, user: str | None) -> tuple[str, str]:
        """Return the call's namespace; refuse a call that reaches outside its connection's scope or identity."""
        from dualmem.auth import whose_memory
        from dualmem.schema import check_id

        pinned = self.connection(ctx)
        if pinned.persona and persona and persona != pinned.persona:
            raise ValueError("this connection is scoped to another persona; leave `persona` out")
        chosen = pinned.persona or persona
        if not chosen:
            raise ValueError("name the persona: this connection is not scoped to one (pass `persona`)")
        token = _access_token()
        if token is not None:  # authenticated: the token's identity, by the one rule
            admin = ADMIN_PERMISSION in token.scopes
            return check_id(chosen, "persona id"), whose_memory(
                identity=token.client_id, admin=admin, claimed=[pinned.user, user]
            )
        if pinned.user and user and user != pinned.user:
            raise ValueError("this connection is scoped to another user; leave `user` out")
        if not (pinned.user or user):
            raise ValueError("name the user: this connection is not scoped to one (pass `user`)")
        return check_id(chosen, "persona id"), check_id(pinned.user or user, "user id")


def _access_token() -> Any:
    """Return the SDK's access token of the current HTTP request (None: no authentication, or stdio)."""
    from mcp.server.auth.middleware.auth_context import get_access_token

    return get_access_token()


class TokenVerifier:
    """The ``mcp`` SDK's token verifier over a :class:`~dualmem.auth.TokenTable`: identity as ``client_id``,
    permissions as ``scopes``."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    async def verify_token(self, token: str) -> Any:
        """Return the access token of a known bearer token, else None (the SDK answers 401)."""
        from mcp.server.auth.provider import AccessToken

        user = self.table.lookup(token)
        return (
            None if user is None else AccessToken(token=token, client_id=user.identity, scopes=list(user.permissions))
        )


class SessionPin:
    """ASGI middleware: an MCP session keeps the credentials and scope it was initialized with.

    The request that creates a session (no ``mcp-session-id``) pins the session id the server answers with to a
    digest of its ``Authorization`` header and scope headers and URL; a later request of that session whose digest
    differs is refused with 403 before it reaches the server.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pins: dict[str, str] = {}

    @staticmethod
    def _digest(headers: dict[str, str], query: bytes) -> str:
        import hashlib
        from urllib.parse import parse_qs

        q = parse_qs(query.decode("latin-1"))
        parts = [headers.get("authorization", ""), *(headers.get(h, "") for h in HEADERS)]
        parts += [",".join(q.get("persona", [])), ",".join(q.get("user", []))]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        digest = self._digest(headers, scope.get("query_string") or b"")
        session = headers.get(SESSION_HEADER)
        if session:
            if self.pins.get(session, digest) != digest:
                body = b'{"error": "this MCP session was initialized with other credentials or scope; start a new session"}'
                await send(
                    {"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"application/json")]}
                )
                await send({"type": "http.response.body", "body": body})
                return None
            if scope.get("method") == "DELETE":
                self.pins.pop(session, None)
            return await self.app(scope, receive, send)

        async def pinning(message: Any) -> None:
            if message["type"] == "http.response.start" and message.get("status", 500) < 400:
                for key, value in message.get("headers") or []:
                    if key.decode("latin-1").lower() == SESSION_HEADER:
                        self.pins[value.decode("latin-1")] = digest
            await send(message)

        return await self.app(scope, receive, pinning)


def build_server(
    settings: Any = None,
    *,
    scope: Scope = Scope(),
    store: Any = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "dualmem",
    tokens: TokenTable | None = None,
    allowed_hosts: tuple[str, ...] = (),
) -> Any:
    """Return a FastMCP server over the store ``settings`` names (or ``store``, a ``DualStore``), scoped by ``scope``;
    with ``tokens``, every HTTP request authenticates with a bearer token of the table."""
    import anyio
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.transport_security import TransportSecuritySettings

    from dualmem.config import Settings
    from dualmem.retrieval.pipeline import Ranker
    from dualmem.stores import dual_of, open_store

    s = Settings.resolve(settings)
    db = dual_of(store) if store is not None else open_store(s)
    ranker = Ranker.from_settings(s)
    scoper = Scoper(scope)
    hosts = [*(f"{h}:*" for h in ("127.0.0.1", "localhost", "[::1]")), *(f"{h}:*" for h in (host, *allowed_hosts))]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(set(hosts)),
        allowed_origins=sorted({f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")}),
    )
    auth = None
    if tokens is not None:
        where = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        auth = AuthSettings(issuer_url=where, resource_server_url=f"{where}/mcp", validate_token_resource=False)  # type: ignore[arg-type]
    verifier = TokenVerifier(tokens) if tokens is not None else None
    server = FastMCP(
        name,
        instructions=INSTRUCTIONS,
        host=host,
        port=port,
        auth=auth,
        token_verifier=verifier,
        transport_security=security,
    )

    async def off_loop(fn: Callable[..., T], *args: Any) -> T:
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args))
        except (DualMemError, ValueError) as exc:
            raise ValueError(public_error(exc)) from None

    @server.tool()
    async def search_memory(
        query: Annotated[str, Field(description="what to look for, in a few words")],
        limit: Annotated[int, Field(ge=1, le=100, description="how many memories to return at most")] = 10,
        kind: Annotated[Kind, Field(description="facts, insights or both")] = "both",
        persona: PersonaArg = None,
        user: UserArg = None,
        ctx: Context | None = None,
    ) -> list[dict[str, Any]]:
        """Search the persona's memory of the user: facts and insights, best first, with ids and sources."""
        ns = scoper.namespace(ctx, persona, user)
        kinds: tuple[MemoryKind, ...] = ("fact", "insight") if kind == "both" else (kind,)  # type: ignore[assignment]
        hits = await off_loop(lambda: ranker.rank(db, ns, query, limit, kinds=kinds))
        return [
            {
                "id": h.item.id,
                "kind": h.item.kind,
                "text": h.item.text,
                "grounding": h.item.grounding,
                "session_id": h.item.source.session_id,
                "event_time": h.item.event_time,
                "score": round(float(h.score), 6),
            }
            for h in hits
        ]

    @server.tool()
    async def add_fact(
        text: Annotated[str, Field(min_length=1, max_length=2000, description="the fact, one self-contained sentence")],
        session_id: Annotated[str | None, Field(description="the conversation it comes from, if known")] = None,
        event_time: Annotated[str | None, Field(description="when it happened (ISO date), if known")] = None,
        persona: PersonaArg = None,
        user: UserArg = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Remember a fact about the user (an objective event they revealed)."""
        import uuid

        from dualmem.schema import Fact, SourceRef

        ns = scoper.namespace(ctx, persona, user)
        fact = Fact(
            id=f"mcp-{uuid.uuid4().hex[:16]}",
            namespace=ns,
            text=text.strip(),
            source=SourceRef(session_id=session_id),
            event_time=event_time,
            meta={"via": "mcp"},
        )
        await off_loop(db.upsert, [fact])
        return {"id": fact.id, "kind": "fact", "text": fact.text}

    @server.tool()
    async def forget(
        item_id: Annotated[
            str | None, Field(description="the id of one memory to forget (as search_memory returned it)")
        ] = None,
        everything: Annotated[
            bool, Field(description="forget ALL of this user's memory (only when the user asks)")
        ] = False,
        persona: PersonaArg = None,
        user: UserArg = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Forget one memory by id, or (everything=true) every trace of this user: memory, history, chats, checkpoints."""
        from dualmem.control.forget import forget as forget_now

        ns = scoper.namespace(ctx, persona, user)
        if bool(item_id) == bool(everything):
            raise ValueError(
                "pass either item_id (one memory) or everything=true (the whole user), not both or neither"
            )
        report = await off_loop(lambda: forget_now(ns[0], ns[1], item=item_id or None, settings=s, store=db))
        return {
            "forgot": report.target.describe(),
            "removed": {k: v for k, v in report.removed.items() if v},
            "checkpointed_threads": report.checkpoints_deleted,
        }

    @server.tool()
    async def memory_history(
        item_id: Annotated[str, Field(description="the id of a memory")],
        persona: PersonaArg = None,
        user: UserArg = None,
        ctx: Context | None = None,
    ) -> list[dict[str, Any]]:
        """Return a memory's history: each ADD / UPDATE / DELETE with its chunk, time and text before and after."""
        from dualmem.control.history import item_history

        ns = scoper.namespace(ctx, persona, user)
        return [dict(r) for r in await off_loop(item_history, db, ns, item_id)]

    return server


def serve(
    settings: Any = None,
    *,
    scope: Scope = Scope(),
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    tokens: TokenTable | None = None,
    allowed_hosts: tuple[str, ...] = (),
) -> None:
    """Serve the memory over ``stdio`` or ``http`` (streamable HTTP at ``http://HOST:PORT/mcp``) until stopped."""
    if transport not in ("stdio", "http"):
        raise ConfigurationError(f"--transport {transport!r}: use stdio or http")
    if transport == "stdio":
        build_server(settings, scope=scope).run("stdio")
        return
    check_exposure(host, tokens, "--tokens FILE (or set DUALMEM_TOKENS)")
    import uvicorn

    server = build_server(settings, scope=scope, host=host, port=port, tokens=tokens, allowed_hosts=allowed_hosts)
    uvicorn.run(SessionPin(server.streamable_http_app()), host=host, port=port, log_level="warning")
