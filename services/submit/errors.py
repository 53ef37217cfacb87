"""The error answers the routes document in the OpenAPI schema, each with its reason in `detail`."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from gpuyard.services.submit.queuedepth import QueueFull
from gpuyard.shared.contracts.api.common import ErrorOut
from gpuyard.shared.stores.events.base import RETRY_AFTER_SECONDS

WHY = {
    400: "Bad request: an invalid Content-Length.",
    401: "No bearer token, or one unknown or revoked.",
    403: "The token's tenant may not do this (another tenant's jobs or models, an admin's page).",
    404: "No such job (or one of another tenant), replica, attempt, token, model or version (or one of "
    "another tenant, not public), or volume or path in it (or one of another tenant).",
    409: "A conflict with the job's state, with an earlier request of the same Idempotency-Key, or with tokens "
    "fixed by the settings; a job id prefix that several jobs share; a model version published with other "
    "bytes, or deleted; a volume's name in use, or a volume a live job mounts.",
    413: "The request body is over the limit, or an upload does not fit in the room its volume has left.",
    429: "The tenant has as many jobs queued as it may: retry after Retry-After (seconds, estimated from how "
    "fast its queue drains).",
    416: "The byte range asked for is outside the output kept (Content-Range says how much there is).",
    503: "The store (its disk full, or its lock held by another writer), the event bus or the model store is "
    "unavailable, or the job or model is changing right now: nothing was done; retry after Retry-After.",
}


RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}
}
HEADERS = {429: RETRY_AFTER, 503: RETRY_AFTER}
Responses = dict[int | str, dict[str, Any]]
"""A route's or router's `responses=`: by status code, what the OpenAPI schema says of that answer."""


def answers(*codes: int) -> Responses:
    """`responses=` for a route or router that can answer `codes`."""
    return {
        code: {
            "model": ErrorOut,
            "description": WHY[code],
            **({"headers": HEADERS[code]} if code in HEADERS else {}),
        }
        for code in codes
    }


REFUSED_422: Responses = {
    422: {
        "description": "Invalid (a list of validation errors, one per field), or refused with one reason "
        "(`detail` a string): a tenant its events cannot name, a job no node could ever hold.",
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
"""The 422 of a route that also refuses a valid request with one reason (`POST /v1/jobs`)."""


def json_answers(*codes: int) -> Responses:
    """`answers` for a route whose own answer is not JSON (a `response_class` such as text): FastAPI would
    document its errors in that media type, but they are JSON (ErrorOut) like every other route's."""
    return {
        code: {
            "description": WHY[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
            **({"headers": HEADERS[code]} if code in HEADERS else {}),
        }
        for code in codes
    }


def too_many(exc: QueueFull) -> JSONResponse:
    """The 429 of a tenant at its queue limit (the route's and the fast path's)."""
    return JSONResponse({"detail": str(exc)}, status_code=429, headers={"Retry-After": str(exc.retry_after)})


def unavailable(exc: Exception) -> JSONResponse:
    """The 503 of a store or bus that cannot be used now (StoreUnavailable, BusUnavailable): its reason, and
    Retry-After the store's own (`retry_after`: longer for a full disk than for a lock held a while)."""
    retry = getattr(exc, "retry_after", RETRY_AFTER_SECONDS)
    return JSONResponse(
        {"detail": f"temporarily unavailable: {exc}"}, status_code=503, headers={"Retry-After": str(retry)}
    )
