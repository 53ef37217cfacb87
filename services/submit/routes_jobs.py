"""/v1/jobs: submit, list, describe, events, cancel, logs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuyard.services.submit.auth import Context, CurrentPrincipal, may_see
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.errors import REFUSED_422, answers, json_answers
from gpuyard.services.submit.modelaccess import servable
from gpuyard.services.submit.queuedepth import QueueFull
from gpuyard.services.submit.streamview import JOB_CONTENT_HEADERS, JOB_TEXT, Access, while_allowed
from gpuyard.services.submit.yamlbody import SpecRoute, yaml_body
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.capacity import unplaceable
from gpuyard.shared.contracts.api.common import CURSOR_MAX, CURSOR_PATTERN, page_cursor, page_place
from gpuyard.shared.contracts.api.jobs import (
    CancelOut,
    JobAccepted,
    JobEventOut,
    JobListOut,
    JobOut,
    SpecCheckOut,
    job_out,
)
from gpuyard.shared.contracts.events.envelope import derived_id, new_id
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobCancelRequested, JobSubmitted
from gpuyard.shared.contracts.events.subjects import tenant_error
from gpuyard.shared.contracts.jobspec import MAX_GPUS_PER_REPLICA, JobSpec, SpecError, read_int, start_error
from gpuyard.shared.contracts.jobstate import JobState, JobView
from gpuyard.shared.stores.events.base import SEARCH_MAX, Order, decode_cursor, encode_cursor
from gpuyard.shared.stores.logs import NOTE, LogKey
from gpuyard.shared.stores.logs.reading import follow as follow_log
from gpuyard.shared.stores.logs.reading import read_range, tail_start
from gpuyard.shared.stores.readmodels.modelregistry import is_model_stream


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


Cursor = Annotated[
    str | None,
    Query(
        pattern=CURSOR_PATTERN,
        max_length=CURSOR_MAX,
        description="Where the page starts: the `next_cursor` of the page before (a place in the listing, "
        "after that page's last item in the order asked).",
    ),
]


def store_cursor(cursor: str | None, order: Order = "newest") -> str | None:
    """The event store's cursor of an API's page cursor (None: the first page)."""
    return encode_cursor(*page_place(cursor), order) if cursor else None


def api_cursor(cursor: str | None, order: Order = "newest") -> str | None:
    """The API's page cursor of the event store's (None: no page after)."""
    return page_cursor(*decode_cursor(cursor, order)) if cursor else None


MIN_PREFIX = 4
"""The shortest job id prefix taken for a job (as git takes a commit's): shorter ones name no job."""
AMBIGUOUS_SHOWN = 5


async def visible_job(ctx, principal, job_id: str) -> JobView:
    """The job `job_id` names, if the caller may see it: its full id, or a unique prefix of it (at least
    MIN_PREFIX characters) among the jobs the caller may see. Routes use the view's `job_id` from here on."""
    doc = await ctx.store.get_projection(job_id) if not is_model_stream(job_id) else None
    if doc is None and len(job_id) >= MIN_PREFIX:
        tenant = None if principal.admin else principal.tenant
        found = await ctx.store.ids_starting(job_id, tenant=tenant, limit=AMBIGUOUS_SHOWN + 1)
        found = [f for f in found if not is_model_stream(f)]  # (the store holds models' streams too)
        if len(found) > 1:
            shown = ", ".join(found[:AMBIGUOUS_SHOWN]) + (", ..." if len(found) > AMBIGUOUS_SHOWN else "")
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"job id prefix {job_id!r} is ambiguous: {shown}; give more of the id",
            )
        if found:
            doc = await ctx.store.get_projection(found[0])
    if doc is None or not may_see(principal, doc["tenant"]):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    return JobView.model_validate(doc)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobAccepted,
    responses=answers(403, 409, 429) | REFUSED_422,
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
    responses=answers(403) | REFUSED_422,
    openapi_extra=SPEC_BODY,
)
async def validate_job(spec: JobSpec, ctx: Context, principal: CurrentPrincipal) -> SpecCheckOut:
    """Check a spec as `POST /v1/jobs` would, and queue nothing: 200 with the spec as it would be stored
    (defaults filled in), or the 403 or 422 the submit would answer. `placeable`: whether a node heard from
    could ever hold it (false only where the platform queues such jobs, GPUYARD_ACCEPT_UNPLACEABLE; else it is
    a 422); `message` also says when the tenant's queue is at its limit (a submit would get 429). The spec in
    JSON, or in YAML (`Content-Type: application/yaml`)."""
    tenant, why = await checked(ctx, principal, spec)
    if why:
        message = f"no node could ever hold it: {why}; it would be queued for a cluster that grows"
    elif not ctx.telemetry.live_nodes():
        message = "valid; no node is heard from yet, so whether one could hold it is not known"
    else:
        message = "valid; POST /v1/jobs would queue it"
    if (limit := ctx.queue.limit_of(tenant)) and ctx.queue.queued(tenant) >= limit:
        retry = ctx.queue.full(tenant).retry_after
        message += (
            f"; but tenant {tenant!r} has {limit} jobs waiting, its limit: a submit now gets 429"
            f" (retry in {retry} s)"
        )
    return SpecCheckOut(valid=True, spec=spec, tenant=tenant, placeable=why is None, message=message)


async def checked(ctx: SubmitContext, principal: Principal, spec: JobSpec) -> tuple[str, str | None]:
    """What `POST /v1/jobs` checks of a spec before it stores anything (its validation aside): the tenant's
    (403: another tenant's without an admin's token; 422: one its events cannot name), that its command and
    environment fit a replica's start (422, `gpuyard.shared.contracts.jobspec.start_error`), that some node could ever hold it
    (422, unless GPUYARD_ACCEPT_UNPLACEABLE; always past MAX_GPUS_PER_REPLICA GPUs a replica), a serve job's
    model (422). Returns the job's tenant and why no node could hold it (None: one could, or no node is heard
    from yet)."""
    tenant = spec.tenant or principal.tenant
    if tenant != principal.tenant and not principal.admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}, not {tenant!r}"
        )
    if (
        bad_tenant := tenant_error(tenant)
    ) is not None:  # the token's tenant: its job events could not be sent
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"{bad_tenant} (the job's tenant)")
    if (too_large := start_error(spec)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, too_large)
    why = unplaceable(spec, ctx.telemetry.live_nodes())
    if spec.resources.gpus > MAX_GPUS_PER_REPLICA:  # the schema's bound, said with the cluster's own size
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"no node could ever hold this job: {why}"
            if why
            else f"needs {spec.resources.gpus:g} GPUs on one node; a replica may have at most "
            f"{MAX_GPUS_PER_REPLICA}",
        )
    if why and not ctx.accept_unplaceable:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"no node could ever hold this job: {why} (GPUYARD_ACCEPT_UNPLACEABLE=true queues such jobs)",
        )
    if spec.serve is not None:
        await servable(ctx, principal, spec.serve, tenant)
    return tenant, why


async def queue_job(
    ctx: SubmitContext, principal: Principal, spec: JobSpec, idempotency_key: str | None
) -> JobAccepted:
    """What `POST /v1/jobs` does, for the route and for its fast path (`fastpath.py`).

    With an Idempotency-Key the job's id is derived from the tenant and the key, and its first event is stored
    under that id (in the event store: the key lasts as long as the job, across restarts): the same request
    again answers the job already queued (`duplicate`), another request with the same key 409. Raises
    QueueFull when the tenant has as many jobs waiting as it may (a retry of a stored job is never refused)."""
    tenant, _ = await checked(ctx, principal, spec)
    job_id = derived_id(tenant, "idempotency", idempotency_key)[:16] if idempotency_key else new_id()[:16]
    try:
        reserved = ctx.queue.admit(tenant, job_id)
    except QueueFull:
        if not idempotency_key or await ctx.store.get_projection(job_id) is None:
            raise
        reserved = False  # the job of this key is stored (and no longer waits): the answer is that job
    name = spec.name or (spec.serve.job_name if spec.serve else f"job-{job_id[:6]}")
    event = JobSubmitted(job_id=job_id, name=name, tenant=tenant, user=principal.name, spec=spec)
    try:
        outcome = await ctx.ledger.append(
            job_id, event, event_id=derived_id(job_id, "submitted"), new=idempotency_key is None
        )
    except BaseException:
        if reserved:
            ctx.queue.release(job_id)
        raise
    view = outcome.view
    if outcome.refused or view is None or (outcome.duplicate and not same_request(view, event)):
        if reserved:
            ctx.queue.release(job_id)
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"Idempotency-Key {idempotency_key!r} was used for another request (job {job_id}): send a new key "
            "for a new job",
        )
    if outcome.duplicate and reserved:
        ctx.queue.release(job_id)  # the job was stored before: the store's count says whether it waits
    elif reserved:
        ctx.queue.stored(job_id)
    return JobAccepted(
        job_id=job_id, name=view.name, tenant=tenant, state=view.state, duplicate=outcome.duplicate
    )


def same_request(view: JobView, event: JobSubmitted) -> bool:
    """Whether a job already stored under an Idempotency-Key is what `event` asks for: the same spec, name and
    user."""
    return view.spec == event.spec and view.name == event.name and view.user == event.user


JOB_STATES = [s.value for s in JobState]
"""The states a listing of jobs asks the store for when none is given: the store holds models', alerts' and
nodes' streams too, in states of their own."""


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
    filters = {
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


async def public_job(ctx, view: JobView) -> JobOut:
    """The public form of a job, a queued one's place in line from the queue's line."""
    place = await ctx.line.place(view.job_id) if view.state == JobState.QUEUED else None
    return job_out(view, place)


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


async def cancel(ctx: SubmitContext, principal: Principal, job_id: str) -> CancelOut:
    """What `POST /v1/jobs/{id}/cancel` does to a job the caller may see (and undeploying, to serve jobs):
    409 for a job already ended."""

    def decide(view: JobView | None):
        if view is None or view.state.terminal or view.cancel_requested:
            return None
        if view.state == JobState.QUEUED:
            return JobCancelled(
                job_id=job_id, attempt=view.attempt, by=principal.name, message="cancelled while queued"
            )
        return JobCancelRequested(job_id=job_id, by=principal.name)

    outcome = await ctx.ledger.record(job_id, decide)
    view = outcome.view
    assert view is not None
    if outcome.event is None and view.state.terminal:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} already {view.state.value}; nothing to cancel"
        )
    if view.state == JobState.CANCELLED:
        message = "cancelled"
    elif view.spec.serve is not None:
        message = "cancel requested; the serving service is stopping the replica"
    else:
        message = "cancel requested; the executor is stopping the job"
    return CancelOut(job_id=job_id, state=view.state, cancel_requested=view.cancel_requested, message=message)


ALL_ATTEMPTS = "all"
ATTEMPT_PATTERN = rf"^([1-9][0-9]{{0,8}}|{ALL_ATTEMPTS})$"
"""`?attempt=`: an attempt's number, or every attempt's output."""


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
    job_id = view.job_id
    if replica >= view.spec.replicas:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has {view.spec.replicas} replica(s)")
    access = Access(request, ctx, principal)
    if attempt == ALL_ATTEMPTS:
        if range_ is not None and not tail and not follow:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                "a Range header reads one attempt's output: give ?attempt=N (1 to "
                f"{view.attempt}) with it, not ?attempt=all",
            )
        return job_output(every_attempt(ctx, view, replica, tail, follow), access)
    number = int(attempt) if attempt else view.attempt
    if number > view.attempt:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has {view.attempt} attempt(s)")
    key = LogKey(job_id, number, replica)
    if range_ is not None and not tail and not follow:
        return await _byte_range(ctx, access, key, range_)
    start = await _tail_start(ctx, key, tail)
    if not follow:
        return job_output(read_range(ctx.logs, key, start), access)
    return job_output(follow_log(ctx.logs, key, start, _attempt_over(ctx, job_id, number)), access)


async def _tail_start(ctx: SubmitContext, key: LogKey, tail: int | None) -> int:
    """Where the output sent begins: its first byte, or where its last `tail` lines begin."""
    if tail and (extent := await ctx.logs.extent(key)) is not None:
        return await tail_start(ctx.logs, key, tail, extent)
    return 0


def _attempt_over(ctx: SubmitContext, job_id: str, number: int) -> Callable[[], Coroutine[Any, Any, bool]]:
    """Whether attempt `number` of the job is over (the job ended, or moved on to another attempt)."""

    async def finished() -> bool:
        doc = await ctx.store.get_projection(job_id)
        return doc is None or doc["attempt"] != number or JobState(doc["state"]).terminal

    return finished


def attempt_line(view: JobView, number: int) -> bytes:
    """The platform's line that opens an attempt's output when every attempt's is sent: its number, how it
    ended (`requeued: node_lost`, `failed: exit_code`…) with why, or its state while it is the job's current
    one (`running`, `queued`…); on one line."""
    found = next((a for a in view.attempts if a.number == number), None)
    said = found.outcome if found is not None and found.outcome else None
    if said is None:
        said = view.state.value if number == view.attempt else "ended"
    message = found.message if found is not None and found.outcome else ""
    if message:
        said += f" ({message})"
    return f"{NOTE}attempt {number}: {' '.join(said.split())}\n".encode()


async def every_attempt(
    ctx: SubmitContext, view: JobView, replica: int, tail: int | None, follow: bool
) -> AsyncIterator[bytes]:
    """Every attempt's output of one replica, in order, each after its `attempt_line` (on a line of its own,
    even after output that did not end its last line). Following, the current attempt is followed until it
    is over, then the next one, until the job ends."""
    number, line_ended = 1, True
    while True:
        key = LogKey(view.job_id, number, replica)
        yield (b"" if line_ended else b"\n") + attempt_line(view, number)
        line_ended = True
        start = await _tail_start(ctx, key, tail)
        current = number == view.attempt
        if follow and current and not view.state.terminal:
            pieces = follow_log(ctx.logs, key, start, _attempt_over(ctx, view.job_id, number))
        else:
            pieces = read_range(ctx.logs, key, start)
        async for piece in pieces:
            yield piece
            line_ended = piece.endswith(b"\n")
        if current and follow and not view.state.terminal:
            doc = await ctx.store.get_projection(view.job_id)
            if doc is None:
                return
            view = JobView.model_validate(doc)  # (moved on: the next attempt is followed)
        if number >= view.attempt:
            return
        number += 1


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


async def _byte_range(ctx: SubmitContext, access: Access, key: LogKey, header: str) -> StreamingResponse:
    """RFC 9110 single byte ranges of the output kept (older output trimmed by the cap is not kept)."""
    extent = await ctx.logs.extent(key)
    end = extent.end if extent else 0
    kept = extent.start if extent else 0
    unit, _, spec = header.partition("=")
    first_text, dash, last_text = spec.strip().partition("-")
    if unit.strip() != "bytes" or not dash or "," in spec or not (first_text or last_text):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"unsupported Range {header!r}: use bytes=FIRST-LAST"
        )
    try:
        if first_text:
            first = int(first_text)
            last = min(int(last_text), end - 1) if last_text else end - 1
        else:
            first, last = max(end - int(last_text), 0), end - 1
    except ValueError:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"unsupported Range {header!r}") from None
    first = max(first, kept)
    if first > last or first >= end:
        raise HTTPException(
            status.HTTP_416_RANGE_NOT_SATISFIABLE,
            f"the output kept is bytes {kept}-{end - 1}" if end > kept else "no output yet",
            headers={"Content-Range": f"bytes */{end}"},
        )
    return job_output(
        read_range(ctx.logs, key, first, last + 1),
        access,
        status.HTTP_206_PARTIAL_CONTENT,
        {"Content-Range": f"bytes {first}-{last}/{end}", "Content-Length": str(last - first + 1)},
    )
