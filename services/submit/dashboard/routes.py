"""The dashboard's addresses: the login form at `/` (the cluster page once logged in), logging in and out, one
route per page of `pages.PAGES`, and the static files. None of them is part of the API's document: the pages
read and change everything through the API itself, which checks the tenant on every call."""

from __future__ import annotations

import time
from importlib.resources import files
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.dashboard.layout import (
    SECURITY_HEADERS,
    STATIC,
    login_html,
    message_html,
    page_headers,
    page_html,
)
from gpuyard.services.submit.dashboard.pages import PAGES, Page
from gpuyard.services.submit.jobs import visible_job
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.jobtokens import is_job_token
from gpuyard.shared.auth.tokens import Principal, TokenRefused

LOGIN_FIELDS_MAX = 4096


def add_dashboard(app: FastAPI) -> None:
    app.mount(STATIC, StaticFiles(directory=str(files(__package__) / "static")), name="dashboard")
    app.add_api_route("/login", login, methods=["POST"], include_in_schema=False)
    app.add_api_route("/logout", logout, methods=["POST"], include_in_schema=False)
    for page in PAGES:
        app.add_api_route(page.path, _shows(page), methods=["GET"], include_in_schema=False)


def _html(text: str, status: int = 200, headers: dict[str, str] = SECURITY_HEADERS) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=headers)


def local_path(next_path: str | None) -> str:
    """Where to go after logging in: a path of this site only (never `//other.site` or a full address)."""
    if not next_path or not next_path.startswith("/") or next_path.startswith("//") or "\\" in next_path:
        return "/"
    return next_path


def logged_in(ctx: SubmitContext, request: Request) -> tuple[Principal, sessions.Session] | str | None:
    """The session's principal and session; a reason when its cookie is no longer good; None without one."""
    cookie = request.cookies.get(sessions.COOKIE)
    if cookie is None or ctx.session_secret is None:
        return None
    try:
        session = sessions.read(ctx.session_secret, cookie)
        return ctx.tokens.authenticate_id(session.token_id), session
    except (sessions.SessionRefused, TokenRefused) as exc:
        return str(exc)


def _shows(page: Page):
    async def show(request: Request) -> Response:
        ctx: SubmitContext = request.app.state.ctx
        found = logged_in(ctx, request)
        if not isinstance(found, tuple):
            response: Response
            if page.path == "/":
                response = _html(login_html(found or _login_off(ctx)), 200)
            else:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                response = RedirectResponse(f"/?next={quote(target)}", status_code=303)
            if found is not None:
                response.delete_cookie(sessions.COOKIE, path="/")
            return response
        principal, session = found
        params = {**page.data(ctx), **request.path_params}
        if "job_id" in params:
            try:
                params["job_id"] = (await visible_job(ctx, principal, params["job_id"])).job_id
            except HTTPException as exc:
                return _html(message_html("Not found", str(exc.detail)), exc.status_code)
        assert ctx.session_secret is not None
        csrf = sessions.csrf_token(ctx.session_secret, session)
        headers = page_headers(request.url.scheme, request.url.hostname, ctx.serving_url)
        return _html(page_html(page, principal, csrf, params), headers=headers)

    show.__name__ = f"page_{page.script.removesuffix('.js')}"
    return show


def _login_off(ctx: SubmitContext) -> str:
    return (
        ""
        if ctx.session_secret is not None
        else "The dashboard's login is off: see the submit service's log."
    )


async def login(request: Request) -> Response:
    ctx: SubmitContext = request.app.state.ctx
    body = await request.body()
    form = {k: v[0] for k, v in parse_qs(body[:LOGIN_FIELDS_MAX].decode("utf-8", "replace")).items()}
    next_path = local_path(form.get("next"))
    if not sessions.same_origin(request.headers.get("origin"), request.headers.get("host")):
        return _html(login_html("A login from another site's page is refused.", next_path), 403)
    if ctx.session_secret is None:
        return _html(login_html(_login_off(ctx), next_path), 503)
    token = form.get("token", "").strip()
    if not token or is_job_token(token):
        return _html(login_html("Give a GPUYARD token.", next_path), 401)
    try:
        entry = ctx.tokens.entry(token)
    except TokenRefused as exc:
        return _html(login_html(f"That token is refused: {exc}.", next_path), 401)
    lifetime = ctx.session_lifetime
    if entry.expires is not None:  # (a session never outlives its token)
        lifetime = min(lifetime, max(entry.expires.timestamp() - time.time(), 1.0))
    cookie, _ = sessions.issue(ctx.session_secret, entry.id, lifetime)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        sessions.COOKIE,
        cookie,
        max_age=int(lifetime),
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request) -> Response:
    """Ends the browser's session, on the server too (a form with the session's CSRF token: no other page can
    log you out)."""
    ctx: SubmitContext = request.app.state.ctx
    found = logged_in(ctx, request)
    if isinstance(found, tuple) and ctx.session_secret is not None:
        form = parse_qs((await request.body())[:LOGIN_FIELDS_MAX].decode("utf-8", "replace"))
        given = values[0] if (values := form.get(sessions.CSRF_FIELD)) else None
        if not sessions.csrf_ok(ctx.session_secret, found[1], given):
            return _html(
                message_html(
                    "Not logged out", "That logout did not come from the dashboard: use its Log out button."
                ),
                403,
            )
        sessions.end(ctx.session_secret, found[1])  # on the server too: a copy of the cookie is refused
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(sessions.COOKIE, path="/")
    return response
