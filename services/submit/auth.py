"""Bearer-token authentication: each token stands for a tenant (and a user); admins see every tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.submit.context import SubmitContext
from shared.tokens import Principal

_bearer = HTTPBearer(auto_error=False, description="A GPUYARD token (gpuyard up prints one and saves it).")


async def get_context(request: Request) -> SubmitContext:
    return request.app.state.ctx


Context = Annotated[SubmitContext, Depends(get_context)]


async def current_principal(
    ctx: Context, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = ctx.tokens.get(credentials.credentials)
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"}
        )
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin token")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]


def may_see(principal: Principal, tenant: str) -> bool:
    return principal.admin or principal.tenant == tenant
