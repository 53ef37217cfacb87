"""A job as the submit service queues, finds and cancels it: what `POST /v1/jobs` does (`queue_job`, for the
route, its fast path `fastpath.py` and deployments `deployments.py`), the job a request names (`visible_job`),
and what a cancel does (`cancel`, for the route and for undeploying)."""

from __future__ import annotations

from fastapi import HTTPException, status

from gpuyard.services.submit.admission import checked
from gpuyard.services.submit.auth import may_see
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.queuedepth import QueueFull
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.jobs import CancelOut, JobAccepted, JobOut, job_out
from gpuyard.shared.contracts.events.envelope import derived_id, new_id
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobCancelRequested, JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, JobView

MIN_PREFIX = 4
"""The shortest job id prefix taken for a job (as git takes a commit's): shorter ones name no job."""
AMBIGUOUS_SHOWN = 5


async def visible_job(ctx: SubmitContext, principal: Principal, job_id: str) -> JobView:
    """The job `job_id` names, if the caller may see it: its full id, or a unique prefix of it (at least
    MIN_PREFIX characters) among the jobs the caller may see. Routes use the view's `job_id` from here on."""
    doc = await ctx.store.get_projection(job_id)
    if doc is None and len(job_id) >= MIN_PREFIX:
        tenant = None if principal.admin else principal.tenant
        found = await ctx.store.ids_starting(job_id, tenant=tenant, limit=AMBIGUOUS_SHOWN + 1)
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


async def public_job(ctx: SubmitContext, view: JobView) -> JobOut:
    """The public form of a job, a queued one's place in line from the queue's line."""
    place = await ctx.line.place(view.job_id) if view.state == JobState.QUEUED else None
    return job_out(view, place)


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
