"""The error answers the routes document in the OpenAPI schema, each with its reason in `detail`."""

from __future__ import annotations

from typing import Any

from shared.api import ErrorOut

WHY = {
    400: "Bad request: an invalid Content-Length or list cursor.",
    401: "No bearer token, or one unknown or revoked.",
    403: "The token's tenant may not do this (another tenant's jobs, an admin's page).",
    404: "No such job (or one of another tenant), replica, attempt or token.",
    409: "A conflict with the job's state, with an earlier request of the same Idempotency-Key, or with tokens "
    "fixed by the settings.",
    413: "The request body is over the limit.",
    416: "The byte range asked for is outside the output kept (Content-Range says how much there is).",
    503: "The store or the event bus is unavailable, or the job is changing right now: retry after Retry-After.",
}


def answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route or router that can answer `codes`."""
    return {code: {"model": ErrorOut, "description": WHY[code]} for code in codes}
