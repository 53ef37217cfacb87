"""/v1/jobs: submit, list, describe, events, cancel, logs. The routes parse and answer: what a submit checks is
`admission.py`'s, what it and a cancel do `jobs.py`'s, how a job's output is read `joblogs.py`'s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any, TypedDict

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuyard.services.submit.admission import spec_check
from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.errors import REFUSED_422, answers, json_answers
from gpuyard.services.submit.joblogs import (
    ALL_ATTEMPTS,
    ATTEMPT_PATTERN,
    attempt_number,
    byte_range,
    every_attempt,
    one_attempt,
)
from gpuyard.services.submit.jobs import cancel, public_job, queue_job, visible_job
from gpuyard.services.submit.paging import Cursor, api_cursor, store_cursor
from gpuyard.services.submit.streamview import JOB_CONTENT_HEADERS, JOB_TEXT, Access, while_allowed
from gpuyard.services.submit.yamlbody import SpecRoute, yaml_body
from gpuyard.shared.contracts.api.jobs import (
    CancelOut,
    JobAccepted,
    JobEventOut,
    JobListOut,
    JobOut,
    SpecCheckOut,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, JobView
from gpuyard.shared.contracts.specfiles import SpecError, read_int
from gpuyard.shared.stores.events.base import SEARCH_MAX, Order
from gpuyard.shared.stores.logs.base import LogKey
from gpuyard.shared.stores.logs.reading import read_range


class JobSpecRoute(SpecRoute):
    """A route of `SpecRoute`'s (a spec in YAML too) whose JSON body with a number too long to read (more than
    Python's 4,300 digits) is a 422 that says so, as a YAML one is: FastAPI's own reading answers a 400 that
    says only that the body could not be parsed."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None:
            return handle

        async def handle_numbers(request: Request) -> Response:
            try:
                return await handle(request)
            except StarletteHTTPException as exc:  # (FastAPI's reading raises Starlette's)
                if exc.status_code == status.HTTP_400_BAD_REQUEST and isinstance(exc.__cause__, ValueError):
                    raise number_error(await request.body()) or exc from None
                raise

        return handle_numbers


def number_error(body: bytes) -> RequestValidationError | None:
    """The 422 of a JSON body that holds a number too long to read (FastAPI's shape: a list in `detail`);
    None for a body that fails for another reason."""
    try:
        json.loads(body, parse_int=read_int)
    except SpecError as exc:
        why = str(exc)
        return RequestValidationError(
            [{"type": "json_invalid", "loc": ["body"], "msg": why, "input": {}, "ctx": {"error": why}}]
        )
    except ValueError:
        return None
    return None


router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=answers(400, 401, 413, 503), route_class=JobSpecRoute
)
SPEC_BODY = yaml_body("#/components/schemas/JobSpec")
"""A spec's body in YAML as well as JSON (`yamlbody.py`), as `gpuyard submit job.yaml` reads it."""


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobAccepted,
    responses=answers(403, 404, 409, 429) | REFUSED_422,
    openapi_extra=SPEC_BODY,
)
async def submit_job(
    spec: JobSpec,
    ctx: Context,
    principal: CurrentPrincipal,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobAccepted:
    """Queue a job. Answers at once with its id, once the job is stored; the job then moves through its states
    (see /events). With an `Idempotency-Key` a retry of the same request answers the same job (`duplicate`:
    true) and queues nothing; the key with another request is refused (409). The spec in JSON, or in YAML
    (`Content-Type: application/yaml`) as `gpuyard submit` reads a file."""
    return await queue_job(ctx, principal, spec, idempotency_key)


@router.post(
    "/validate",
    response_model=SpecCheckOut,
    responses=answers(403, 404) | REFUSED_422,
    openapi_extra=SPEC_BODY,
)
async def validate_job(spec: JobSpec, ctx: Context, principal: CurrentPrincipal) -> SpecCheckOut:
    """Check a spec as `POST /v1/jobs` would, and queue nothing: 200 with the spec as it would be stored
    (defaults filled in), or the 403 or 422 the submit would answer. `placeable`: whether a node heard from
    could ever hold it (false only where the platform queues such jobs, GPUYARD_ACCEPT_UNPLACEABLE; else it is
    a 422); `message` also says when the tenant's queue is at its limit (a submit would get 429). The spec in
    JSON, or in YAML (`Content-Type: application/yaml`)."""
    return await spec_check(ctx, principal, spec)


JOB_STATES = [s.value for s in JobState]
"""The states a listing of jobs asks the store for when none is given: the store holds models', alerts' and
nodes' streams too, in states of their own."""


class JobFilters(TypedDict):
    """Which jobs a listing holds, as the store's `list_projections` and `count_projections` take them."""

    states: list[str]
    tenant: str | None
    user: str | None
    name: str | None
    search: str | None


@router.get("", response_model=JobListOut, responses=answers(403))
async def list_jobs(
    ctx: Context,
    principal: CurrentPrincipal,
    state: Annotated[list[JobState] | None, Query(description="Repeat to ask for several states.")] = None,
    tenant: str | None = None,
    user: Annotated[str | None, Query(description="Only the jobs this user submitted (exact).")] = None,
    name: Annotated[str | None, Query(description="Only the jobs of this name (exact).")] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=SEARCH_MAX,
            description="Only the jobs whose id, name, user or tenant holds this text (the case of ASCII "
            "letters aside; `%` and `_` are themselves).",
        ),
    ] = None,
    order: Annotated[
        Order, Query(description="newest (the default) or oldest first, by submission time.")
    ] = "newest",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> JobListOut:
    """Jobs newest first (or oldest first), a page at a time: pass `next_cursor` back as ?cursor= (with the
    same filters and order) for the next one; `total` counts the jobs of every page. A tenant sees its own
    jobs; an admin sees all, or one tenant's with ?tenant=."""
    if not principal.admin:
        if tenant not in (None, principal.tenant):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}")
        tenant = principal.tenant
    filters: JobFilters = {
        "states": [s.value for s in state] if state else JOB_STATES,
        "tenant": tenant,
        "user": user,
        "name": name,
        "search": q or None,
    }
    page = await ctx.store.list_projections(
        **filters, order=order, limit=limit, cursor=store_cursor(cursor, order)
    )
    return JobListOut(
        items=[await public_job(ctx, JobView.model_validate(d)) for d in page.items],
        next_cursor=api_cursor(page.next_cursor, order),
        total=await ctx.store.count_projections(**filters),
    )


@router.get("/validate", include_in_schema=False)
async def validate_is_posted() -> None:
    """`/v1/jobs/validate` takes a spec (POST): a GET there is a 405, not a job of that id."""
    raise HTTPException(
        status.HTTP_405_METHOD_NOT_ALLOWED, "POST a spec to /v1/jobs/validate", headers={"Allow": "POST"}
    )


@router.get("/{job_id}", response_model=JobOut, responses=answers(404, 409))
async def get_job(job_id: str, ctx: Context, principal: CurrentPrincipal) -> JobOut:
    return await public_job(ctx, await visible_job(ctx, principal, job_id))


@router.get("/{job_id}/events", response_model=list[JobEventOut], responses=answers(404, 409))
async def job_events(
    job_id: str, ctx: Context, principal: CurrentPrincipal, after: Annotated[int, Query(ge=0)] = 0
) -> list[JobEventOut]:
    """The job's events in order, each with its version; ?after=N returns only those after version N."""
    job_id = (await visible_job(ctx, principal, job_id)).job_id
    return [
        JobEventOut(version=s.version, event=s.event.to_dict())
        for s in await ctx.store.read_stream(job_id)
        if s.version > after
    ]


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=CancelOut,
    responses=answers(404, 409),
)
async def cancel_job(job_id: str, ctx: Context, principal: CurrentPrincipal) -> CancelOut:
    """A queued job is cancelled at once; a placed or running one is stopped by its executor (a serve job: by
    the serving service that holds it)."""
    return await cancel(ctx, principal, (await visible_job(ctx, principal, job_id)).job_id)


@router.get(
    "/{job_id}/logs",
    response_class=PlainTextResponse,
    responses={
        **json_answers(400, 401, 404, 409, 413, 416, 503),  # (errors in JSON, not in the route's text/plain)
        206: {
            "description": "The byte range asked for (a Range header).",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
    },
)
async def job_logs(
    job_id: str,
    request: Request,
    ctx: Context,
    principal: CurrentPrincipal,
    replica: Annotated[int, Query(ge=0)] = 0,
    attempt: Annotated[
        str | None,
        Query(
            pattern=ATTEMPT_PATTERN,
            description="which attempt's output: its number (1 is the first; the latest by default), or `all`: "
            "every attempt's in order, each after a line of the platform's that names it",
        ),
    ] = None,
    tail: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    follow: bool = False,
    range_: Annotated[
        str | None,
        Header(
            alias="Range",
            description="bytes=FIRST-LAST, bytes=FIRST- or bytes=-LENGTH (offsets in the replica's output)",
        ),
    ] = None,
):
    """A replica's combined stdout and stderr, streamed from the log store (the executor that ran it ships it
    there as it comes), in pieces: memory stays bounded whatever the size. ?tail=N: the last N lines;
    ?follow=true: goes on until the attempt ends; a `Range: bytes=…` header: that part of it (206). The latest
    attempt's by default; ?attempt=N another's (a requeued attempt's output stays readable); ?attempt=all every
    attempt's in order, each after a line `[gpuyard] attempt N: <how it ended, or its state>` (?tail=N: the last
    N lines of each; with ?follow=true it goes on through the attempts that follow until the job ends). The
    text is the job's own, sent as `text/plain; charset=utf-8` with `X-Content-Type-Options: nosniff` (a browser
    never takes it for a page), and only while the caller's token (or session) stays valid: a stream ends within
    a second of its revocation or expiry."""
    view = await visible_job(ctx, principal, job_id)
    if replica >= view.spec.replicas:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"job {view.job_id} has {view.spec.replicas} replica(s)"
        )
    access = Access(request, ctx, principal)
    ranged = range_ if not tail and not follow else None  # (a Range header with either is not read)
    if attempt == ALL_ATTEMPTS:
        if ranged is not None:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                "a Range header reads one attempt's output: give ?attempt=N (1 to "
                f"{view.attempt}) with it, not ?attempt=all",
            )
        return job_output(every_attempt(ctx, view, replica, tail, follow), access)
    key = LogKey(view.job_id, attempt_number(view, attempt), replica)
    if ranged is not None:
        first, last, end = await byte_range(ctx.logs, key, ranged)
        return job_output(
            read_range(ctx.logs, key, first, last + 1),
            access,
            status.HTTP_206_PARTIAL_CONTENT,
            {"Content-Range": f"bytes {first}-{last}/{end}", "Content-Length": str(last - first + 1)},
        )
    return job_output(await one_attempt(ctx, key, tail, follow), access)


def job_output(
    chunks: AsyncIterator[bytes],
    access: Access,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> StreamingResponse:
    """A job's output as the API sends it: text that is the job's, never sniffed into anything else, for as
    long as the caller may read it (`streamview.while_allowed`)."""
    return StreamingResponse(
        while_allowed(chunks, access),
        status_code=status_code,
        media_type=JOB_TEXT,
        headers={**JOB_CONTENT_HEADERS, **(headers or {})},
    )
