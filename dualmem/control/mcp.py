"""DualMem's memory as MCP tools, served with the official ``mcp`` SDK (FastMCP) over stdio or streamable HTTP.

Tools: ``search_memory`` (facts and insights, ranked by the one retrieval
path: :class:`~dualmem.retrieval.pipeline.Ranker`), ``add_fact``, ``forget``
(one item, or with ``everything`` the whole user: :mod:`~dualmem.control.forget`)
and ``memory_history`` (:mod:`~dualmem.control.history`).

**Scope.** Every call acts on exactly one namespace ``(persona, user)``, taken from:

1. the server's own scope (``dualmem mcp --persona P --user U``): every connection is pinned to it;
2. else the connection's: HTTP headers ``X-DualMem-Persona`` / ``X-DualMem-User``, or the
   URL's ``?persona=…&user=…``; an MCP session keeps the scope of its first request;
3. else the call's ``persona`` and ``user`` arguments.

A call naming another persona or user than its connection's scope is refused
with an error, so a connection scoped to one user cannot read, add to or forget
another's memory; the tools reach the store through the same namespace-exact
APIs as every other caller. The scope is a routing rule, not authentication:
serve HTTP on a loopback port, or behind your own authentication.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from dualmem.errors import ConfigurationError
from dualmem.schema import MemoryKind

try:
    from mcp.server.fastmcp import Context, FastMCP
except ImportError as exc:  # pragma: no cover - the extra is a dev dependency
    raise ConfigurationError("serving MCP needs the mcp package: pip install 'dualmem[mcp]'") from exc

T = TypeVar("T")
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
    """Resolve each call's namespace from the server scope, the connection (headers, URL, session) and the call."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.sessions: dict[str, Scope] = {}

    def connection(self, ctx: Any) -> Scope:
        """Return the scope a call's connection is pinned to (server scope over HTTP headers and URL)."""
        request = getattr(getattr(ctx, "request_context", None), "request", None) if ctx is not None else None
        persona, user = self.scope.persona, self.scope.user
        if request is not None:
            headers, query = request.headers, request.query_params
            persona = persona or headers.get(HEADERS[0]) or query.get("persona")
            user = user or headers.get(HEADERS[1]) or query.get("user")
            session = headers.get(SESSION_HEADER)
            if session:
                first = self.sessions.setdefault(session, Scope(persona, user))
                if first != Scope(persona, user):
                    raise ValueError(
                        f"this MCP session is scoped to {first.persona!r}/{first.user!r}; open a new session for another scope"
                    )
        return Scope(persona, user)

    def namespace(self, ctx: Any, persona: str | None, user: str | None) -> tuple[str, str]:
        """Return the call's namespace; refuse a call that reaches outside its connection's scope."""
        pinned = self.connection(ctx)
        chosen = []
        for part, fixed, asked in (("persona", pinned.persona, persona), ("user", pinned.user, user)):
            if fixed and asked and asked != fixed:
                raise ValueError(f"this connection is scoped to {part} {fixed!r}; it cannot reach {part} {asked!r}")
            value = fixed or asked
            if not value:
                raise ValueError(f"name the {part}: this connection is not scoped to one (pass `{part}`)")
            chosen.append(str(value))
        return chosen[0], chosen[1]


def build_server(
    settings: Any = None, *, scope: Scope = Scope(), store: Any = None, host: str = "127.0.0.1", port: int = 8000,
    name: str = "dualmem",
) -> Any:  # fmt: skip
    """Return a FastMCP server over the store ``settings`` names (or ``store``, a ``DualStore``), scoped by ``scope``."""
    import anyio

    from dualmem.config import Settings
    from dualmem.retrieval.pipeline import Ranker
    from dualmem.stores import dual_of, open_store

    s = Settings.resolve(settings)
    db = dual_of(store) if store is not None else open_store(s)
    ranker = Ranker.from_settings(s)
    scoper = Scoper(scope)
    server = FastMCP(name, instructions=INSTRUCTIONS, host=host, port=port)

    async def off_loop(fn: Callable[..., T], *args: Any) -> T:
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args))
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None

    @server.tool()
    async def search_memory(
        query: Annotated[str, Field(description="what to look for, in a few words")],
        limit: Annotated[int, Field(ge=1, le=100, description="how many memories to return at most")] = 10,
        kind: Annotated[Kind, Field(description="facts, insights or both")] = "both",
        persona: PersonaArg = None, user: UserArg = None, ctx: Context | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Search the persona's memory of the user: facts and insights, best first, with ids and sources."""
        ns = scoper.namespace(ctx, persona, user)
        kinds: tuple[MemoryKind, ...] = ("fact", "insight") if kind == "both" else (kind,)  # type: ignore[assignment]
        hits = await off_loop(lambda: ranker.rank(db, ns, query, limit, kinds=kinds))
        return [
            {"id": h.item.id, "kind": h.item.kind, "text": h.item.text, "grounding": h.item.grounding,
             "session_id": h.item.source.session_id, "event_time": h.item.event_time, "score": round(float(h.score), 6)}
            for h in hits
        ]  # fmt: skip

    @server.tool()
    async def add_fact(
        text: Annotated[str, Field(min_length=1, max_length=2000, description="the fact, one self-contained sentence")],
        session_id: Annotated[str | None, Field(description="the conversation it comes from, if known")] = None,
        event_time: Annotated[str | None, Field(description="when it happened (ISO date), if known")] = None,
        persona: PersonaArg = None, user: UserArg = None, ctx: Context | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Remember a fact about the user (an objective event they revealed)."""
        import uuid

        from dualmem.schema import Fact, SourceRef

        ns = scoper.namespace(ctx, persona, user)
        fact = Fact(id=f"mcp-{uuid.uuid4().hex[:16]}", namespace=ns, text=text.strip(), source=SourceRef(session_id=session_id),
                    event_time=event_time, meta={"via": "mcp"})  # fmt: skip
        await off_loop(db.upsert, [fact])
        return {"id": fact.id, "kind": "fact", "text": fact.text}

    @server.tool()
    async def forget(
        item_id: Annotated[str | None, Field(description="the id of one memory to forget (as search_memory returned it)")] = None,
        everything: Annotated[bool, Field(description="forget ALL of this user's memory (only when the user asks)")] = False,
        persona: PersonaArg = None, user: UserArg = None, ctx: Context | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Forget one memory by id, or (everything=true) every trace of this user: memory, history, chats, checkpoints."""
        from dualmem.control.forget import forget as forget_now

        ns = scoper.namespace(ctx, persona, user)
        if bool(item_id) == bool(everything):
            raise ValueError(
                "pass either item_id (one memory) or everything=true (the whole user), not both or neither"
            )
        report = await off_loop(lambda: forget_now(ns[0], ns[1], item=item_id or None, settings=s, store=db))
        return {"forgot": report.target.describe(), "removed": {k: v for k, v in report.removed.items() if v},
                "checkpointed_threads": report.checkpoints_deleted}  # fmt: skip

    @server.tool()
    async def memory_history(
        item_id: Annotated[str, Field(description="the id of a memory")],
        persona: PersonaArg = None, user: UserArg = None, ctx: Context | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Return a memory's history: each ADD / UPDATE / DELETE with its chunk, time and text before and after."""
        from dualmem.control.history import item_history

        ns = scoper.namespace(ctx, persona, user)
        return [dict(r) for r in await off_loop(item_history, db, ns, item_id)]

    return server


def serve(settings: Any = None, *, scope: Scope = Scope(), transport: str = "stdio", host: str = "127.0.0.1",
          port: int = 8000) -> None:  # fmt: skip
    """Serve the memory over ``stdio`` or ``http`` (streamable HTTP at ``http://HOST:PORT/mcp``) until stopped."""
    if transport not in ("stdio", "http"):
        raise ConfigurationError(f"--transport {transport!r}: use stdio or http")
    server = build_server(settings, scope=scope, host=host, port=port)
    server.run("stdio" if transport == "stdio" else "streamable-http")
