"""`POST /v1/jobs` without FastAPI's routing and dependency solving, which cost as much CPU as the rest of a
submit, for the requests that need nothing of them: a JSON job spec from a known bearer token.

A request without a token, or with one refused, never gets here: `app.BodyLimit` answers it 401 before its
body is read. Whatever the fast path cannot take as it is (another route, a dashboard session's cookie, a body
that is not JSON or not a valid spec, another tenant's job, an Idempotency-Key over its limit, the store or
bus unavailable) goes on to the FastAPI app with its body, and the app answers it as documented at /docs.
What the fast path answers is what the route would (the route and it share `queue_job`; tests compare
them)."""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.services.submit.body import read_body, replaying
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.errors import too_many
from gpuyard.services.submit.jobs import queue_job
from gpuyard.services.submit.queuedepth import QueueFull
from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.auth.tokens import TokenRefused
from gpuyard.shared.bus.jetstream import BusUnavailable
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import ConcurrencyError, StoreUnavailable

SUBMIT_PATH = "/v1/jobs"
IDEMPOTENCY_KEY_MAX = 200  # as the route's Header(max_length=...)
LEFT_TO_THE_APP = (HTTPException, StoreUnavailable, BusUnavailable, ConcurrencyError)


def is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class FastSubmit:
    def __init__(self, app: ASGIApp, ctx: SubmitContext):
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != SUBMIT_PATH:
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of a repeated header, as Starlette reads it
        body = await read_body(receive)
        if body is None:
            return None
        try:
            answer = await self.accept(headers, body)
        except QueueFull as exc:
            return await too_many(exc)(scope, receive, send)
        if answer is None:
            return await self.app(scope, replaying(body, receive), send)
        await send(
            {
                "type": "http.response.start",
                "status": 202,
                "headers": [
                    (b"content-length", str(len(answer)).encode()),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})
        return None

    async def accept(self, headers: dict[bytes, bytes], body: bytes) -> bytes | None:
        """The answer's body for a job queued here; None: left to the app. Raises QueueFull (answered 429
        here, as the app would)."""
        authorization = headers.get(b"authorization")
        token = bearer_token(authorization.decode("latin-1") if authorization is not None else None)
        try:
            principal = self.ctx.tokens.authenticate(token) if token is not None else None
        except TokenRefused:  # the app says why
            return None
        key = headers.get(b"idempotency-key")
        if principal is None or not is_json(headers.get(b"content-type")):
            return None
        if key is not None and len(key) > IDEMPOTENCY_KEY_MAX:
            return None
        try:
            spec = JobSpec.model_validate(json.loads(body))
        except Exception:  # (invalid JSON, too deeply nested, not a valid spec): the app says why
            return None
        try:
            accepted = await queue_job(self.ctx, principal, spec, key.decode("latin-1") if key else None)
        except LEFT_TO_THE_APP:
            return None
        return accepted.model_dump_json().encode()
