"""Bearer-token authentication: each token stands for a tenant (and a user); admins see every tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPBearer

from services.submit.context import SubmitContext
from shared.bearer import bearer_token
from shared.jobtokens import is_job_token
from shared.tokens import Principal, TokenRefused, may_see  # noqa: F401 (the routes' import)


class Bearer(HTTPBearer):
    """The bearer security scheme as /docs shows it, reading the header with `bearer_token` (the fast path's
    reading too)."""

    async def __call__(self, request: Request) -> str | None:  # type: ignore[override]
        return bearer_token(request.headers.get("authorization"))


_bearer = Bearer(auto_error=False, description="A GPUYARD token (gpuyard up prints one and saves it).")


async def get_context(request: Request) -> SubmitContext:
    return request.app.state.ctx


Context = Annotated[SubmitContext, Depends(get_context)]


async def current_principal(ctx: Context, token: Annotated[str | None, Depends(_bearer)]) -> Principal:
    if token is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if is_job_token(token):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a job's publish token is accepted by POST /v1/models only",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        return ctx.tokens.authenticate(token)
    except TokenRefused as exc:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, str(exc), headers={"WWW-Authenticate": "Bearer"}
        ) from None


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin token")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]
