"""The memory browser's web app (Starlette, Jinja2 templates, a few lines of JavaScript; no build step, no assets from
the internet): personas → users → facts and insights → grounding, source turns and history; a search that runs the
product's ranking; export and forget.

**Who sees what.** Without tokens (loopback only, see :func:`dualmem.auth.check_exposure`) the person at the machine
sees every user. With a token table (:class:`~dualmem.auth.TokenTable`: ``--tokens FILE`` or ``DUALMEM_TOKENS``) every
page needs a token — a bearer header, or the cookie the sign-in form sets (HttpOnly, SameSite=Strict) — and shows only
the token's own user (:data:`~dualmem.auth.ADMIN_PERMISSION`: every user); another user's pages answer 404 as if they
did not exist. Forms carry a CSRF token bound to the credential; the Host header is checked (DNS rebinding); pages
are sent with a Content-Security-Policy that allows only this server's own script and style, and every memory text
is HTML-escaped.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from dualmem.auth import TokenTable, TokenUser
from dualmem.errors import ConfigurationError, DualMemError
from dualmem.schema import check_id

try:
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
except ImportError as exc:  # pragma: no cover - the extra is a dev dependency
    raise ConfigurationError(
        "the memory browser needs starlette, jinja2 and uvicorn: pip install 'dualmem[ui]'"
    ) from exc

HERE = Path(__file__).parent
COOKIE = "dualmem_token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


def _when(value: Any) -> str:
    text = value.isoformat() if hasattr(value, "isoformat") else str(value or "")
    return text[:16].replace("T", " ")


class Browser:
    """The app's state: the store, the ranker, the token table and the CSRF key (one per server process)."""

    def __init__(self, settings: Any, store: Any, tokens: TokenTable | None) -> None:
        from dualmem.retrieval.pipeline import Ranker

        self.settings, self.dual, self.tokens = settings, store, tokens
        self.ranker = Ranker.from_settings(settings)
        self.key = secrets.token_bytes(32)
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
        self.env.filters.update(u=lambda v: quote(str(v), safe=""), when=_when)

    # ------------------------------------------------------------------ who is asking

    def caller(self, request: Request) -> tuple[TokenUser | None, str]:
        """Return (the token's user, the credential) — (None, "") without tokens; raise 401 for a missing/bad one."""
        if self.tokens is None:
            return None, ""
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
        user = self.tokens.lookup(token)
        if user is None:
            raise _Stop(self.page(request, "login.html", code=401, failed=bool(token)))
        return user, token

    def csrf(self, credential: str) -> str:
        """Return the CSRF token of a credential (forms carry it; posts are checked against it)."""
        return hmac.new(self.key, credential.encode(), hashlib.sha256).hexdigest()[:32]

    def namespace(self, request: Request, user: TokenUser | None) -> tuple[str, str]:
        """Return the page's (persona, user) when the caller may see it and it holds memory, else stop with 404."""
        try:
            persona = check_id(request.path_params["persona"], "persona id")
            who = check_id(request.path_params["user"], "user id")
        except ValueError:
            raise _Stop(self.error(request, 404, "No such memory.")) from None
        if not self.visible(user, who) or not self.dual.count((persona, who), status=None):
            raise _Stop(self.error(request, 404, "No such memory."))
        return persona, who

    @staticmethod
    def visible(user: TokenUser | None, who: str) -> bool:
        """Return whether the caller may see ``who``'s memory (everyone without tokens; else own, or admin)."""
        return user is None or user.admin or user.identity == who

    # ------------------------------------------------------------------ rendering

    def page(self, request: Request, template: str, code: int = 200, **values: Any) -> HTMLResponse:
        user, credential = values.pop("_caller", (None, ""))
        body = self.env.get_template(template).render(
            root="",
            identity=user.identity if user else None,
            admin=bool(user and user.admin),
            csrf=self.csrf(credential),
            **values,
        )
        return HTMLResponse(body, status_code=code)

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.page(request, "error.html", code=status, status=status, message=message)


class _Stop(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _base(persona: str, user: str) -> str:
    return f"/p/{quote(persona, safe='')}/u/{quote(user, safe='')}"


def build_app(
    settings: Any = None,
    *,
    store: Any = None,
    tokens: TokenTable | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: tuple[str, ...] = (),
) -> Starlette:
    """Return the memory browser over the store ``settings`` names (or ``store``); ``tokens``: who may see what."""
    from dualmem.config import Settings
    from dualmem.stores import dual_of, open_store
    from dualmem.ui import data

    s = Settings.resolve(settings)
    app_state = Browser(s, dual_of(store) if store is not None else open_store(s), tokens)

    def guarded(handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            import anyio

            try:
                user, credential = app_state.caller(request)
                if request.method == "POST":
                    form = await request.form()
                    origin = request.headers.get("origin")
                    if not hmac.compare_digest(str(form.get("csrf", "")), app_state.csrf(credential)) or (
                        origin not in (None, "null") and origin.split("://", 1)[-1] != request.headers.get("host")
                    ):
                        return app_state.error(request, 403, "This form has expired; reload the page and try again.")
                    request.state.form = form
                return await anyio.to_thread.run_sync(handler, request, user, credential)
            except _Stop as stop:
                return stop.response
            except DualMemError as exc:
                from dualmem.redact import public_error

                return app_state.error(request, 400, public_error(exc))

        return endpoint

    def personas(request: Request, user: TokenUser | None, cred: str) -> Response:
        shown = data.personas(app_state.dual, lambda who: app_state.visible(user, who))
        from dualmem.redact import public_url

        store_name = public_url(s.store_uri) if user is None or user.admin else "(shared store)"
        return app_state.page(request, "personas.html", personas=shown, store=store_name, _caller=(user, cred))

    def users(request: Request, user: TokenUser | None, cred: str) -> Response:
        try:
            persona = check_id(request.path_params["persona"], "persona id")
        except ValueError:
            return app_state.error(request, 404, "No such persona.")
        shown = data.users(app_state.dual, persona, lambda who: app_state.visible(user, who))
        if not shown:
            return app_state.error(request, 404, "No such persona.")
        return app_state.page(request, "users.html", persona=persona, users=shown, _caller=(user, cred))

    def items(request: Request, user: TokenUser | None, cred: str) -> Response:
        persona, who = app_state.namespace(request, user)
        q = request.query_params
        kind, status, session = q.get("kind", ""), q.get("status", "active"), q.get("session", "")
        offset = int(q["offset"]) if q.get("offset", "").isdigit() else 0
        page = data.items_page(
            app_state.dual,
            (persona, who),
            kind=kind if kind in ("fact", "insight") else "",
            status=status if status in ("active", "superseded", "all") else "active",
            session=session,
            offset=offset,
        )
        filters = urlencode({"kind": kind, "status": status, "session": session})
        return app_state.page(
            request,
            "items.html",
            persona=persona,
            user=who,
            base=_base(persona, who),
            page=page,
            kind=kind,
            status=status,
            session=session,
            filters=filters,
            may_forget=app_state.visible(user, who),
            _caller=(user, cred),
        )

    def item(request: Request, user: TokenUser | None, cred: str) -> Response:
        persona, who = app_state.namespace(request, user)
        view = data.item_view(app_state.dual, (persona, who), request.path_params["item"])
        if view is None:
            return app_state.error(request, 404, "No such memory item.")
        return app_state.page(
            request, "item.html", persona=persona, user=who, base=_base(persona, who), v=view, _caller=(user, cred)
        )

    def search(request: Request, user: TokenUser | None, cred: str) -> Response:
        persona, who = app_state.namespace(request, user)
        query = request.query_params.get("q", "").strip()[:500]
        hits = (
            data.ranked(app_state.dual, (persona, who), query, app_state.ranker, s.tuning.retrieval_k) if query else []
        )
        return app_state.page(
            request,
            "search.html",
            persona=persona,
            user=who,
            base=_base(persona, who),
            query=query,
            hits=hits,
            ranker=app_state.ranker.spec,
            _caller=(user, cred),
        )

    def export(request: Request, user: TokenUser | None, cred: str) -> Response:
        from dualmem.control.export import export_namespace

        persona, who = app_state.namespace(request, user)
        folder = Path(tempfile.mkdtemp(prefix="dualmem-export-"))
        path = folder / f"{persona}-{who}.json"
        export_namespace(app_state.dual, (persona, who), path)
        from starlette.background import BackgroundTask

        def cleanup() -> None:
            path.unlink(missing_ok=True)
            os.rmdir(folder)

        return FileResponse(
            path,
            media_type="application/json",
            filename=f"dualmem-{persona}-{who}.json",
            background=BackgroundTask(cleanup),
        )

    def forget(request: Request, user: TokenUser | None, cred: str) -> Response:
        from dualmem.control.forget import carry_out, locate, plan_forget
        from dualmem.control.places import Target

        persona, who = app_state.namespace(request, user)
        plan = plan_forget(Target(persona, who, None), locate(s, app_state.dual))
        values: dict[str, Any] = {"persona": persona, "user": who, "base": _base(persona, who), "_caller": (user, cred)}
        if request.method == "GET":
            return app_state.page(request, "forget.html", plan="\n".join(plan.lines()), **values)
        if str(request.state.form.get("confirm", "")).strip() != who:
            return app_state.page(request, "forget.html", code=400, plan="\n".join(plan.lines()), **values)
        report = carry_out(plan)
        return app_state.page(request, "forget.html", report="\n".join(report.lines()), **values)

    async def login(request: Request) -> Response:
        if app_state.tokens is None:
            return RedirectResponse("/", status_code=303)
        if request.method == "GET":
            return app_state.page(request, "login.html")
        token = str((await request.form()).get("token", ""))
        if app_state.tokens.lookup(token) is None:
            return app_state.page(request, "login.html", code=401, failed=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return response

    def logout(request: Request, user: TokenUser | None, cred: str) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    async def headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers.update(
            {
                "Content-Security-Policy": CSP,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "same-origin",
                "Cache-Control": "no-store",
            }
        )
        return response

    ns = "/p/{persona}/u/{user}"
    routes = [
        Route("/", guarded(personas)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", guarded(logout), methods=["POST"]),
        Route("/p/{persona}", guarded(users)),
        Route(ns, guarded(items)),
        Route(ns + "/i/{item}", guarded(item)),
        Route(ns + "/search", guarded(search)),
        Route(ns + "/export", guarded(export)),
        Route(ns + "/forget", guarded(forget), methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    from starlette.middleware.base import BaseHTTPMiddleware

    hosts = sorted({"127.0.0.1", "localhost", "[::1]", "::1", host, *allowed_hosts})
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts),
            Middleware(BaseHTTPMiddleware, dispatch=headers),
        ],
    )


def serve(
    settings: Any = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    tokens: TokenTable | None = None,
    allowed_hosts: tuple[str, ...] = (),
) -> None:
    """Serve the memory browser at ``http://HOST:PORT/`` until stopped."""
    import uvicorn

    from dualmem.auth import check_exposure

    check_exposure(host, tokens, "--tokens FILE (or set DUALMEM_TOKENS)")
    app = build_app(settings, tokens=tokens, host=host, allowed_hosts=allowed_hosts)
    uvicorn.run(app, host=host, port=port, log_level="warning")
