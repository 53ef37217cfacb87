"""The API's long-lived answers (the live event stream, `GET /v1/events/stream`; a job's output,
`GET /v1/jobs/{id}/logs`): what their caller may see, and for how long.

What: of an event, the same as the API's reads show it. A tenant sees its own jobs' and models' events, and
alerts about its own jobs (as GET /v1/alerts); of a GPU sample, the GPUs of every node, with another tenant's
holders blanked (as GET /v1/nodes shows them: a share, never whose). An admin sees everything.

How long: as long as the credential the request came with would still be taken (`Access`): it is checked again,
as a new request's would be, before each piece is sent and every RECHECK_SECONDS while none comes; once it is
refused (the token revoked or expired, the dashboard session logged out or expired) the answer ends there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fastapi import HTTPException, Request

from gpuyard.services.submit.auth import current_principal
from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.events.alerts import AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.nodes import GpuSample
from gpuyard.shared.contracts.events.subjects import tenant_of_subject

RECHECK_SECONDS = 0.5
"""How often a stream that sends nothing checks its caller's credential again: it ends within this (and the
time of a check) once the credential is refused."""
JOB_TEXT = "text/plain; charset=utf-8"
"""The media type of what a job writes (its output), as the API sends it."""
JOB_CONTENT_HEADERS = {"X-Content-Type-Options": "nosniff"}
"""The headers of every answer whose content a job controls (its output, its events' text): a browser takes
it for what its media type says, never for a page or a script."""


class Access:
    """The credential a request came with (a bearer token or a dashboard session's cookie), to be checked
    again while its answer streams: by `auth.current_principal` itself, as a new request's would be."""

    def __init__(self, request: Request, ctx: SubmitContext, principal: Principal):
        self.request, self.ctx, self.principal = request, ctx, principal

    async def refused(self) -> str | None:
        """Why the credential is no longer taken (or now stands for someone else); None while it is."""
        token = bearer_token(self.request.headers.get("authorization"))
        try:
            now = await current_principal(self.request, self.ctx, token)
        except HTTPException as exc:
            return str(exc.detail)
        return None if now == self.principal else "the token now stands for another tenant or user"


async def while_allowed(
    chunks: AsyncIterator[bytes],
    access: Access,
    farewell: Callable[[str], bytes] | None = None,
    every: float = RECHECK_SECONDS,
) -> AsyncIterator[bytes]:
    """`chunks` for as long as `access` is not refused, checked before each chunk and every `every` seconds
    while none comes; then the stream ends (with `farewell(why)` last, where given) and `chunks` is closed."""
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next(chunks))
            await asyncio.wait({pending}, timeout=every)
            if (why := await access.refused()) is not None:
                if farewell is not None:
                    yield farewell(why)
                return
            if not pending.done():
                continue
            next_chunk, pending = pending, None
            try:
                chunk = next_chunk.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()  # (taken: an error of the last piece read is not logged as lost)
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _next(chunks: AsyncIterator[bytes]) -> bytes:
    return await anext(chunks)


ALERT_DATA = (AlertRaised, AlertResolved)


def seen_by(principal: Principal, event: CloudEvent, nats_subject: str) -> CloudEvent | None:
    """`event` as `principal` may see it, or None when it may not."""
    if principal.admin:
        return event
    data = event.data
    subject_tenant = tenant_of_subject(nats_subject)
    if subject_tenant is not None:
        return event if subject_tenant == principal.tenant else None  # a job's: its tenant's, as published
    if isinstance(data, GpuSample):
        return _blanked(principal, event, data)
    owner = getattr(data, "tenant", None)
    if isinstance(data, ALERT_DATA) or owner is not None:
        return event if owner == principal.tenant else None  # a model's or an alert's: its tenant's
    return event if getattr(data, "job_id", None) is None else None


def _blanked(principal: Principal, event: CloudEvent, sample: GpuSample) -> CloudEvent:
    if all(h.tenant == principal.tenant for g in sample.gpus for h in g.holders):
        return event
    gpus = [
        g.model_copy(
            update={
                "holders": [
                    h
                    if h.tenant == principal.tenant
                    else h.model_copy(update={"job_id": "", "tenant": "", "user": ""})
                    for h in g.holders
                ]
            }
        )
        for g in sample.gpus
    ]
    return event.model_copy(update={"data": sample.model_copy(update={"gpus": gpus})})
