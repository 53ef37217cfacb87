"""Authentication: a bearer token, or a dashboard session's cookie (`shared/auth/sessions.py`) that stands for the token it
logged in with. Each token stands for a tenant (and a user); admins see every tenant."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPBearer
from starlette.requests import cookie_parser

from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.auth.jobtokens import is_job_token
from gpuyard.shared.auth.tokens import Principal, TokenRefused, may_see  # noqa: F401 (the routes' import)


class Bearer(HTTPBearer):
    """The bearer security scheme as /docs shows it, reading the header with `bearer_token` (the fast path's
    reading too)."""

    async def __call__(self, request: Request) -> str | None:  # type: ignore[override]
        return bearer_token(request.headers.get("authorization"))


presented_token = Bearer(
    auto_error=False, description="A GPUYARD token (gpuyard up prints one and saves it)."
)


async def get_context(request: Request) -> SubmitContext:
    return request.app.state.ctx


Context = Annotated[SubmitContext, Depends(get_context)]


MISSING_TOKEN = "missing bearer token: send 'Authorization: Bearer <token>'"
JOB_TOKEN_ELSEWHERE = (
    "a job's publish token is accepted by POST /v1/models only (and its checkpoint token by POST "
    "/v1/jobs/{id}/checkpoints only)"
)
PUBLISH_PATH = "/v1/models"
"""The route that takes a job's publish token (`routes_models.publisher`)."""
CHECKPOINTS_PATH = re.compile(r"/v1/jobs/[^/]+/checkpoints")
"""The route that takes a job's checkpoint token (`routes_checkpoints.checkpoint_claims`)."""


def takes_job_tokens(method: str, path: str) -> bool:
    """Whether the route checks a job's token itself (each its own scope)."""
    return method == "POST" and (path == PUBLISH_PATH or CHECKPOINTS_PATH.fullmatch(path) is not None)


CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _refused(reason: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, reason, headers=CHALLENGE)


def refusal_before_body(
    ctx: SubmitContext, method: str, path: str, headers: Mapping[bytes, bytes]
) -> str | None:
    """Why a request to the API (every route under /v1 needs a token) is refused (401) before its body is
    read, or None: it carries no credential at all, a token that is unknown, revoked or expired, or a job's
    token elsewhere than the routes that check it themselves, still before the body (`takes_job_tokens`). A dashboard session's cookie is checked by the route, as the body the dashboard sends is small."""
    authorization = headers.get(b"authorization")
    token = bearer_token(authorization.decode("latin-1") if authorization is not None else None)
    if token is None:
        cookie = headers.get(b"cookie")
        if cookie is not None and sessions.COOKIE in cookie_parser(cookie.decode("latin-1")):
            return None
        return MISSING_TOKEN
    if is_job_token(token):
        return None if takes_job_tokens(method, path) else JOB_TOKEN_ELSEWHERE
    try:
        ctx.tokens.authenticate(token)
    except TokenRefused as exc:
        return str(exc)
    return None


async def current_principal(
    request: Request, ctx: Context, token: Annotated[str | None, Depends(presented_token)]
) -> Principal:
    if token is None:
        cookie = request.cookies.get(sessions.COOKIE)
        if cookie is not None and ctx.session_secret is not None:
            return session_principal(ctx, request, cookie)
        raise _refused(MISSING_TOKEN)
    if is_job_token(token):
        raise _refused(JOB_TOKEN_ELSEWHERE)
    try:
        return ctx.tokens.authenticate(token)
    except TokenRefused as exc:
        raise _refused(str(exc)) from None


def session_principal(ctx: SubmitContext, request: Request, cookie: str) -> Principal:
    """Who a dashboard session's cookie stands for; a request that changes something must also carry the
    session's CSRF token and come from the dashboard's own origin (403 otherwise)."""
    assert ctx.session_secret is not None
    try:
        session = sessions.read(ctx.session_secret, cookie)
        principal = ctx.tokens.authenticate_id(session.token_id)
    except (sessions.SessionRefused, TokenRefused) as exc:
        raise _refused(str(exc)) from None
    if request.method not in sessions.SAFE_METHODS:
        if not sessions.same_origin(request.headers.get("origin"), request.headers.get("host")):
            raise HTTPException(status.HTTP_403_FORBIDDEN, "a request from another site's page")
        if not sessions.csrf_ok(ctx.session_secret, session, request.headers.get(sessions.CSRF_HEADER)):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, "missing or wrong CSRF token: reload the page and try again"
            )
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin token")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]
