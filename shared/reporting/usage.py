"""GPU-hours accounting: allocated and used, per job, user or tenant, over a window (`GET /v1/usage`).

- Allocated: the job's GPUs (its share per replica × its replicas) × the time each attempt held them, from
  its placement (`placed_at`, else `started_at`) to its end (`ended_at`, or now while it runs), as the job's
  events say (the store's projection); clipped to the window.
- Used: from the GPU history (`gpuyard.shared.stores.gpuhistory.base`): each sample's utilization × the holder's share × the
  sample's seconds, summed over the window. A GPU shared by several jobs reports one utilization: each holder
  is counted that utilization on its share.
- Waste: allocated − used (never below zero).

A job that the history saw but the store no longer lists in the window (see LOOKBACK_SECONDS) is counted
from its samples alone: allocated is then the share × the seconds it was sampled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpuyard.shared.contracts.jobstate import (
    ACTIVE_STATES,
    LIVE_STATES,
    TERMINAL_STATES,
    JobView,
    state_values,
)
from gpuyard.shared.stores.events import Projections
from gpuyard.shared.stores.gpuhistory.base import GpuPoint

LOOKBACK_SECONDS = 30 * 86400.0
"""A finished job is read from the store when it was created at most this long before the window starts."""
PAGE = 500

CSV_COLUMNS = ("tenant", "user", "job_id", "jobs", "allocated_gpu_hours", "used_gpu_hours", "waste_gpu_hours")
"""The columns of the usage report as CSV: `gpuyard usage --csv` and the dashboard's download."""


@dataclass(slots=True)
class JobUsage:
    job_id: str
    tenant: str
    user: str
    allocated: float = 0.0
    """GPU-seconds allocated in the window."""
    used: float = 0.0
    """GPU-seconds used in the window (utilization-weighted)."""
    sampled: float = 0.0
    """GPU-seconds allocated that the history saw (the share × the seconds sampled)."""
    util_seconds: float = 0.0
    util_sum: float = 0.0
    """Σ utilization × seconds of the job's GPUs' samples: their mean utilization is util_sum / util_seconds."""

    @property
    def mean_utilization_pct(self) -> float | None:
        return self.util_sum / self.util_seconds if self.util_seconds else None


def _ts(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def allocated_seconds(view: JobView, since: float, until: float) -> float:
    """GPU-seconds the job held within [since, until): its GPUs × each attempt's placed time."""
    total = 0.0
    for attempt in view.attempts:
        start = _ts(attempt.placed_at) or _ts(attempt.started_at)
        if start is None:
            continue
        end = _ts(attempt.ended_at)
        if end is None:
            if attempt is not view.attempts[-1] or view.state not in ACTIVE_STATES:
                continue  # (an attempt without its end that is not the running one holds nothing now)
            end = until
        total += max(0.0, min(end, until) - max(start, since))
    return total * view.gpus


def used_by_job(points: Iterable[GpuPoint], usages: dict[str, JobUsage]) -> dict[str, JobUsage]:
    """Add the history's figures to the jobs' usages (a job only the history knows gets a usage of its own)."""
    for p in points:
        for h in p.holders:
            u = usages.get(h.job_id)
            if u is None:
                u = usages[h.job_id] = JobUsage(h.job_id, h.tenant, h.user)
            u.used += h.used
            u.sampled += h.allocated
            if p.utilization_pct is not None:
                u.util_seconds += p.util_seconds
                u.util_sum += p.utilization_pct * p.util_seconds
    return usages


def job_usages(
    views: Iterable[JobView], points: Iterable[GpuPoint], since: float, until: float
) -> list[JobUsage]:
    """Every job's usage in [since, until) that held GPUs in it, by job id."""
    usages = {
        v.job_id: JobUsage(v.job_id, v.tenant, v.user, allocated=allocated_seconds(v, since, until))
        for v in views
        if v.gpus > 0
    }
    known = set(usages)
    used_by_job(points, usages)
    for job_id, u in usages.items():
        if job_id not in known:
            u.allocated = u.sampled
    return sorted((u for u in usages.values() if u.allocated > 0 or u.used > 0), key=lambda u: u.job_id)


@dataclass(frozen=True, slots=True)
class UsageRow:
    tenant: str
    user: str | None
    job_id: str | None
    jobs: int
    allocated_gpu_hours: float
    used_gpu_hours: float

    @property
    def waste_gpu_hours(self) -> float:
        return max(0.0, self.allocated_gpu_hours - self.used_gpu_hours)


BY = ("tenant", "user", "job")


def group(usages: Iterable[JobUsage], by: str) -> list[UsageRow]:
    """The usages summed per tenant, per (tenant, user) or per job, by key."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    sums: dict[tuple, list[float]] = {}
    for u in usages:
        key = (u.tenant, u.user if by != "tenant" else None, u.job_id if by == "job" else None)
        row = sums.setdefault(key, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += u.allocated
        row[2] += u.used
    return [
        UsageRow(tenant, user, job, int(n), allocated / 3600, used / 3600)
        for (tenant, user, job), (n, allocated, used) in sorted(
            sums.items(), key=lambda kv: tuple(k or "" for k in kv[0])
        )
    ]


async def jobs_in_window(store: Projections, *, since: float, tenant: str | None) -> list[JobView]:
    """The jobs that may have held GPUs since `since`: every live one, and the finished ones created at most
    LOOKBACK_SECONDS before it (newest first, read page by page until older)."""
    views: list[JobView] = []
    for states, oldest in ((LIVE_STATES, None), (TERMINAL_STATES, since - LOOKBACK_SECONDS)):
        cursor = None
        while True:
            page = await store.list_projections(
                states=state_values(states), tenant=tenant, limit=PAGE, cursor=cursor
            )
            for doc in page.items:
                view = JobView.model_validate(doc)
                if oldest is not None and view.created_at.timestamp() < oldest:
                    return views
                if view.finished_at is None or view.finished_at.timestamp() >= since:
                    views.append(view)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    return views
