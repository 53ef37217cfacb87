"""GPU history and accounting (docs/monitor.md, "History and accounting"): `/v1/usage` (GPU-hours allocated and
used), `/v1/gpus/history` (a node's GPUs over a window) and `/v1/jobs/{id}/gpu` (a job's GPUs over its run).

The figures come from the job's events (allocated) and from the GPU history the monitors write (used;
`gpuyard.shared.stores.gpuhistory.base`: beside a SQLite event store, or in its MongoDB database; 503 while it cannot be reached).
A tenant sees its own jobs' usage, and on a node's GPUs the figures, but of another tenant's holder only its
share (`other`); an admin sees everything, or one tenant's usage with `?tenant=`."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status

from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.errors import answers
from gpuyard.services.submit.jobs import visible_job
from gpuyard.services.submit.routes_platform import holder_out
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.usage import (
    GpuHistoryOut,
    GpuPointOut,
    JobGpuOut,
    UsageBy,
    UsageOut,
    UsageRowOut,
)
from gpuyard.shared.contracts.fieldtypes import DURATION_PATTERN, NAME_PATTERN, QUANTITY_MAX
from gpuyard.shared.contracts.units import parse_duration
from gpuyard.shared.reporting.usage import allocated_seconds, group, job_usages, jobs_in_window, used_by_job
from gpuyard.shared.stores.gpuhistory.base import GpuHistory, GpuPoint, downsample, open_gpu_history

router = APIRouter(prefix="/v1", tags=["usage"], responses=answers(400, 401, 413, 503))

MAX_WINDOW_SECONDS = 400 * 86400.0
"""The longest window asked for: a longer `since` is answered for the last 400 days (`since` in the answer)."""
POINTS_PER_GPU = 600
"""A history answer holds about this many points per GPU by default: a longer window gets a coarser step."""
MAX_POINTS_PER_GPU = 10_000
"""The finest step a window is answered in: at most this many points per GPU (a finer `step` asked for is
answered in the finest one, `step_seconds` in the answer)."""
STEP_DESCRIPTION = (
    "Seconds per point (default: about 600 points per GPU; at most 10,000 points per GPU, a finer step is "
    "coarsened: `step_seconds` says the one used)."
)
NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
Since = Annotated[
    str,
    Query(
        pattern=DURATION_PATTERN,
        max_length=QUANTITY_MAX,
        description="How far back: `7d`, `1h`, `90m`, `1h30m`, or seconds; at most 400 days (a longer window "
        "is answered for the last 400 days).",
    ),
]


def window(since: str) -> tuple[float, float]:
    """(start, now) in seconds since the epoch, of a `since` the query's pattern took (more than no time), the
    window at most MAX_WINDOW_SECONDS."""
    seconds = min(parse_duration(since), MAX_WINDOW_SECONDS)
    now = time.time()
    return now - seconds, now


async def history_of(request: Request, ctx) -> GpuHistory:
    """The GPU history of the event store, opened once per app (StoreUnavailable, a 503, while it cannot be)."""
    history = getattr(request.app.state, "gpu_history", None)
    if history is None:
        try:
            opened = await open_gpu_history(ctx.store)
        except ValueError as exc:  # (an event store that keeps no GPU history)
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"no GPU history: {exc}") from exc
        history = getattr(request.app.state, "gpu_history", None)
        if history is None:  # (else another request opened it meanwhile: that one is kept)
            request.app.state.gpu_history = history = opened
        else:
            await opened.close()
    return history


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def point_out(principal: Principal, p: GpuPoint, *, only_job: str | None = None) -> GpuPointOut:
    return GpuPointOut(
        node=p.node,
        gpu=p.gpu,
        t=_at(p.t),
        seconds=round(p.seconds, 3),
        utilization_pct=None if p.utilization_pct is None else round(p.utilization_pct, 1),
        memory_used_bytes=None if p.memory_used_bytes is None else int(p.memory_used_bytes),
        memory_total_bytes=p.memory_total_bytes,
        holders=[
            holder_out(principal, h.job_id, h.tenant, h.user, round(h.fraction, 4))
            for h in p.holders
            if only_job is None or h.job_id == only_job
        ],
    )


def step_for(span: float, step: float | None) -> float:
    """The step asked for, else one that keeps about POINTS_PER_GPU points per GPU (a whole second); a step
    that would give more than MAX_POINTS_PER_GPU points is made the finest that does not."""
    if step is None:
        return max(1.0, math.ceil(span / POINTS_PER_GPU))
    return float(max(step, math.ceil(span / MAX_POINTS_PER_GPU)))


@router.get("/usage", response_model=UsageOut, responses=answers(403))
async def usage(
    request: Request,
    ctx: Context,
    principal: CurrentPrincipal,
    since: Since = "7d",
    by: Annotated[UsageBy, Query(description="tenant, user or job.")] = UsageBy.TENANT,
    tenant: Annotated[
        str | None,
        Query(pattern=NAME_PATTERN, description="Only this tenant's (admins; a tenant sees its own)."),
    ] = None,
) -> UsageOut:
    """GPU-hours allocated (share × time placed or running) and used (weighted by the GPUs' utilization) over
    the window, per tenant, user or job, with the waste between them."""
    if not principal.admin:
        if tenant not in (None, principal.tenant):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}")
        tenant = principal.tenant
    start, now = window(since)
    history = await history_of(request, ctx)
    views = await jobs_in_window(ctx.store, since=start, tenant=tenant)
    points = await history.points(since=start, until=now, tenant=tenant)
    usages = [u for u in job_usages(views, points, start, now) if tenant is None or u.tenant == tenant]
    return UsageOut(
        since=_at(start),
        until=_at(now),
        by=by,
        rows=[
            UsageRowOut(
                tenant=r.tenant,
                user=r.user,
                job_id=r.job_id,
                jobs=r.jobs,
                allocated_gpu_hours=round(r.allocated_gpu_hours, 6),
                used_gpu_hours=round(r.used_gpu_hours, 6),
                waste_gpu_hours=round(r.waste_gpu_hours, 6),
            )
            for r in group(usages, by.value)
        ],
    )


@router.get("/gpus/history", response_model=GpuHistoryOut)
async def gpu_history(
    request: Request,
    ctx: Context,
    principal: CurrentPrincipal,
    node: Annotated[str, Query(pattern=NODE_PATTERN, description="The node whose GPUs.")],
    since: Since = "1h",
    step: Annotated[
        int | None,
        Query(ge=1, le=86400, description=STEP_DESCRIPTION),
    ] = None,
) -> GpuHistoryOut:
    """A node's GPUs over the window: utilization, memory used and holders, one point per GPU per step. Another
    tenant's holder shows only as `other` with its share."""
    start, now = window(since)
    history = await history_of(request, ctx)
    every = step_for(now - start, step)
    points = downsample(await history.points(since=start, until=now, node=node), every)
    return GpuHistoryOut(
        node=node,
        since=_at(start),
        until=_at(now),
        step_seconds=every,
        points=[point_out(principal, p) for p in points],
    )


@router.get("/jobs/{job_id}/gpu", response_model=JobGpuOut, responses=answers(404, 409))
async def job_gpu(
    request: Request,
    ctx: Context,
    principal: CurrentPrincipal,
    job_id: str,
    step: Annotated[
        int | None,
        Query(ge=1, le=86400, description=STEP_DESCRIPTION),
    ] = None,
) -> JobGpuOut:
    """A job's GPUs over its run, as the GPU history has them: utilization and memory per GPU, its mean
    utilization, and its GPU-hours allocated and used."""
    view = await visible_job(ctx, principal, job_id)
    history = await history_of(request, ctx)
    start = view.created_at.timestamp()
    end = view.finished_at.timestamp() if view.finished_at is not None else time.time()
    raw = await history.points(since=start, until=end + 1, job_id=view.job_id)
    figures = used_by_job(raw, {}).get(view.job_id)
    every = step_for(end - start, step)
    peak = max((p.memory_used_bytes for p in raw if p.memory_used_bytes is not None), default=None)
    mean = figures.mean_utilization_pct if figures is not None else None
    return JobGpuOut(
        job_id=view.job_id,
        allocated_gpu_hours=round(allocated_seconds(view, start, end) / 3600, 6),
        used_gpu_hours=round(figures.used / 3600, 6) if figures is not None else 0.0,
        mean_utilization_pct=None if mean is None else round(mean, 1),
        peak_memory_used_bytes=None if peak is None else int(peak),
        step_seconds=every,
        points=[point_out(principal, p, only_job=view.job_id) for p in downsample(raw, every)],
    )
