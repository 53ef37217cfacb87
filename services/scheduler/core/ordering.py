"""The order in which waiting jobs are considered.

Higher priority class first. Inside a class, with fair share on: the tenant whose next job stays within its
guarantee before a tenant that would borrow, then the smallest weighted dominant share (DRF over GPUs, CPUs
and memory, updated after every placement), then the tenant name; each tenant's own jobs go oldest first
(submitted_at, then job id). With fair share off: (priority, submitted_at, job id).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from services.scheduler.core.model import JobRequest
from services.scheduler.core.quota import QuotaLedger


def arrival_key(job: JobRequest) -> tuple:
    return (-job.priority, job.submitted_at, job.job_id)


def in_order(queue: list[JobRequest], ledger: QuotaLedger, fair_share: bool) -> Iterator[JobRequest]:
    """Yields jobs one at a time; the ledger must be updated before asking for the next one."""
    ordered = sorted(queue, key=arrival_key)
    if not fair_share:
        yield from ordered
        return
    start = 0
    while start < len(ordered):
        priority = ordered[start].priority
        end = start
        tenants: dict[str, deque[JobRequest]] = {}
        while end < len(ordered) and ordered[end].priority == priority:
            job = ordered[end]
            tenants.setdefault(job.tenant, deque()).append(job)
            end += 1
        start = end
        if len(tenants) == 1:
            yield from next(iter(tenants.values()))
            continue
        heap = [_key(ledger, tenant, jobs[0]) for tenant, jobs in tenants.items()]
        heapq.heapify(heap)
        while heap:
            tenant = heapq.heappop(heap)[-1]
            jobs = tenants[tenant]
            yield jobs.popleft()
            if jobs:
                heapq.heappush(heap, _key(ledger, tenant, jobs[0]))


def _key(ledger: QuotaLedger, tenant: str, job: JobRequest) -> tuple:
    return (ledger.would_borrow(job), ledger.dominant_share(tenant), tenant)
