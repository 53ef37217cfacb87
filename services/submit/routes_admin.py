"""Token management (admin only): create (the token shown once), list (never a token or its hash), revoke.
A change is written to the tokens file, which every submit instance re-reads on its next request, and a
stream in progress on its next check (`streamview.while_allowed`)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, HTTPException, Response, status

from gpuyard.services.submit.auth import Admin, Context
from gpuyard.services.submit.errors import Responses, answers
from gpuyard.shared.auth.tokens import TokenEntry, TokensFixed
from gpuyard.shared.contracts.api.tenants import TokenCreated, TokenIn, TokenOut

router = APIRouter(prefix="/v1/admin/tokens", tags=["admin"], responses=answers(400, 401, 403, 413))
REFUSED: Responses = {
    422: {
        "description": "Invalid (a list of validation errors, one per field), or refused with one reason "
        "(`detail` a string): an `expires_at` already past.",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/HTTPValidationError"},
                        {"$ref": "#/components/schemas/ErrorOut"},
                    ]
                }
            }
        },
    }
}


def token_out(entry: TokenEntry) -> TokenOut:
    return TokenOut.model_validate(entry.model_dump())


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TokenCreated,
    responses=answers(409) | REFUSED,
)
async def create_token(ctx: Context, _: Admin, body: TokenIn) -> TokenCreated:
    """A new token; the answer is the only time it is shown (the platform keeps its hash)."""
    now = datetime.now(UTC)
    if (past := body.past(now)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, past)
    try:
        token, entry = ctx.tokens.create(body.tenant, body.user, body.admin, body.expiry(now))
    except TokensFixed as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return TokenCreated(**entry.model_dump(), token=token)


@router.get("", response_model=list[TokenOut])
async def list_tokens(ctx: Context, _: Admin) -> list[TokenOut]:
    """Every token, expired ones included (with their expiry), oldest first."""
    return [token_out(e) for e in ctx.tokens.entries()]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=answers(404, 409))
async def revoke_token(ctx: Context, _: Admin, token_id: str) -> Response:
    """Revoke a token: refused (401) from the next request on, by every submit instance; the streams it opened
    (the event stream, a job's output followed, and those of its dashboard sessions) end within a second."""
    if any(e.id == token_id for e in ctx.tokens.inline.values()):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"token {token_id} is set by GPUYARD_TOKENS (the settings): remove it there",
        )
    try:
        revoked = ctx.tokens.revoke(token_id)
    except TokensFixed as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    if revoked is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no token {token_id!r}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
