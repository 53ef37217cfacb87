"""`GET /v1/jobs/{id}/why`: the explanation `gpuyard why` prints (shared/reporting/why.py), for the dashboard's job page
and any client: one wording of a job's reasons everywhere."""

from __future__ import annotations

from fastapi import APIRouter

from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.errors import answers
from gpuyard.services.submit.jobs import public_job, visible_job
from gpuyard.shared.contracts.api.jobs import WhyOut
from gpuyard.shared.reporting import why

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=answers(400, 401, 413, 503))


@router.get("/{job_id}/why", response_model=WhyOut, responses=answers(404, 409))
async def job_why(job_id: str, ctx: Context, principal: CurrentPrincipal) -> WhyOut:
    """Why the job waits, where it runs or how it ended: a sentence and labelled rows, as `gpuyard why` says it."""
    summary, rows = why.explain(await public_job(ctx, await visible_job(ctx, principal, job_id)))
    return WhyOut(summary=summary, rows=[[label, value] for label, value in rows])
