"""/v1/jobs/{job_id}/checkpoints: a job reports the checkpoints it saves (`gpuyard.checkpoint`, docs/storage.md).

Only the job itself reports them, with its checkpoint token (`GPUYARD_CHECKPOINT_TOKEN`, scope `jobs:checkpoint`,
`gpuyard.shared.auth.jobtokens`), which this route alone accepts: for the job it was made for, while the
attempt it was given to is the job's current one and still placed or running. A person's token, an admin's
included, is refused (403: a report says what the job's own code did), and so is a job's publish token; another
job's checkpoint token, of the same tenant or another, is answered as if the job did not exist (404). Each report
is a `job.checkpointed` event, and the job's view (`GET /v1/jobs/{id}`) says the latest. A job records one report
a second at most (429 sooner, with Retry-After): its events stay few, whatever its code does."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, status

from gpuyard.services.submit.auth import CHALLENGE, Context, presented_token
from gpuyard.services.submit.errors import RETRY_AFTER, Responses, answers
from gpuyard.shared.auth.jobtokens import (
    CHECKPOINT_SCOPE,
    PUBLISH_SCOPE,
    JobClaims,
    JobTokenError,
    is_job_token,
    read_secret,
    verify,
)
from gpuyard.shared.auth.tokens import TokenRefused
from gpuyard.shared.contracts.api.common import ErrorOut
from gpuyard.shared.contracts.api.jobs import CheckpointAccepted, CheckpointIn
from gpuyard.shared.contracts.events.envelope import derived_id
from gpuyard.shared.contracts.events.jobs import JobCheckpointed
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobView

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=answers(400, 401, 413, 503))

MIN_REPORT_SECONDS = 1.0
"""The least time between two reports a job records (`job.checkpointed`)."""
TOO_SOON: Responses = {
    429: {
        "model": ErrorOut,
        "description": f"The job reported a checkpoint less than {MIN_REPORT_SECONDS:g} s ago: not recorded; "
        "retry after Retry-After (seconds).",
        "headers": RETRY_AFTER,
    }
}
NOT_THE_JOB = (
    "only the job itself reports its checkpoints, with its checkpoint token (GPUYARD_CHECKPOINT_TOKEN, which "
    "gpuyard.checkpoint sends)"
)


def _unauthorized(why: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, why, headers=CHALLENGE)


def _no_job(job_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")


async def checkpoint_claims(
    job_id: str, ctx: Context, token: Annotated[str | None, Depends(presented_token)]
) -> JobClaims:
    """The claims of the job's own checkpoint token: 401 without a token, or with one that cannot be used; 403
    for a token that is not a checkpoint token; 404 for another job's."""
    if token is None:
        raise _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    if not is_job_token(token):
        try:
            ctx.tokens.authenticate(token)
        except TokenRefused as exc:
            raise _unauthorized(str(exc)) from None
        raise HTTPException(status.HTTP_403_FORBIDDEN, NOT_THE_JOB)
    if ctx.publish_secret_file is None:
        raise _unauthorized("this platform gives jobs no tokens")
    try:
        secret = read_secret(ctx.publish_secret_file)
    except JobTokenError as exc:
        raise _unauthorized(str(exc)) from None
    try:
        claims = verify(secret, token, scope=CHECKPOINT_SCOPE)
    except JobTokenError as exc:
        if publish_token(secret, token):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"a job's publish token: {NOT_THE_JOB}") from None
        raise _unauthorized(str(exc)) from None
    if claims.job_id != job_id:
        raise _no_job(job_id)
    return claims


def publish_token(secret: bytes, token: str) -> bool:
    """Whether `token` is a valid publish token of this platform (a job's, for another route)."""
    try:
        verify(secret, token, scope=PUBLISH_SCOPE)
    except JobTokenError:
        return False
    return True


@router.post(
    "/{job_id}/checkpoints",
    status_code=status.HTTP_201_CREATED,
    response_model=CheckpointAccepted,
    responses=answers(403, 404, 409) | TOO_SOON,
)
async def report_checkpoint(
    job_id: str,
    report: CheckpointIn,
    ctx: Context,
    claims: Annotated[JobClaims, Depends(checkpoint_claims)],
) -> CheckpointAccepted:
    """Record a checkpoint the job saved (`job.checkpointed`): its step, when and its size. 409 once the attempt
    whose token it is has ended (its token is void); 429 within a second of the job's previous report; the same
    report twice is recorded once."""
    now = datetime.now(UTC)
    saved_at = report.saved_at or now
    event_id = derived_id(job_id, claims.attempt, "checkpointed", report.step, saved_at.isoformat())
    wait: list[float] = []

    def decide(view: JobView | None) -> JobCheckpointed | None:
        wait.clear()  # (decided again after a concurrent write: on the newer view)
        if view is None or view.tenant != claims.tenant or not current(view, claims):
            return None
        reported = JobCheckpointed(
            job_id=job_id,
            attempt=claims.attempt,
            step=report.step,
            size_bytes=report.size_bytes,
            saved_at=saved_at,
        )
        if (left := too_soon(view, reported, now)) > 0:
            wait.append(left)
            return None
        return reported

    outcome = await ctx.ledger.record(job_id, decide, event_id=lambda _view: event_id)
    view = outcome.view
    if view is None or view.tenant != claims.tenant:
        raise _no_job(job_id)
    if wait:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"job {job_id} reported a checkpoint less than {MIN_REPORT_SECONDS:g} s ago: this one is not recorded",
            headers={"Retry-After": str(math.ceil(wait[-1]))},
        )
    if outcome.event is None or outcome.refused is not None:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"attempt {claims.attempt} of job {job_id} is not running (the job is {view.state.value}, attempt "
            f"{view.attempt}): its checkpoint token is void",
        )
    return CheckpointAccepted(
        job_id=job_id, attempt=claims.attempt, step=report.step, duplicate=outcome.duplicate
    )


def too_soon(view: JobView, reported: JobCheckpointed, now: datetime) -> float:
    """The seconds before the job may report another checkpoint (0 or less: now; the one it reported last, sent
    again, is a duplicate the ledger answers at once)."""
    last = view.checkpoint
    if last is None or last.reported_at is None:
        return 0.0
    if (last.step, last.saved_at, last.attempt) == (reported.step, reported.saved_at, reported.attempt):
        return 0.0
    return MIN_REPORT_SECONDS - (now - last.reported_at).total_seconds()


def current(view: JobView, claims: JobClaims) -> bool:
    """Whether the token's attempt is the job's current one, placed or running."""
    return view.attempt == claims.attempt and view.state in ACTIVE_STATES
