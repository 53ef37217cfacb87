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
from itertools import groupby
from operator import attrgetter

from services.scheduler.core.model import JobRequest
from services.scheduler.core.quota import QuotaLedger

_JOB_ID = attrgetter("job_id")
_SUBMITTED = attrgetter("submitted_at")
_PRIORITY = attrgetter("priority")


def arrival_key(job: JobRequest) -> tuple:
    return (-job.priority, job.submitted_at, job.job_id)


def by_arrival(queue: list[JobRequest]) -> list[JobRequest]:
    """`sorted(queue, key=arrival_key)`, as stable sorts on one field each, least significant first (the order
    is the same; keys of one type compare at C level, no key tuples are made)."""
    ordered = sorted(queue, key=_JOB_ID)
    ordered.sort(key=_SUBMITTED)
    ordered.sort(key=_PRIORITY, reverse=True)  # stable, reverse included: equal priorities keep their order
    return ordered


def in_order(queue: list[JobRequest], ledger: QuotaLedger, fair_share: bool) -> Iterator[JobRequest]:
    """Yields jobs one at a time; the ledger must be updated before asking for the next one."""
    ordered = by_arrival(queue)
    if not fair_share:
        yield from ordered
        return
    quotas_on = ledger.quotas_on
    for _priority, block in groupby(ordered, key=_PRIORITY):
        tenants: dict[str, deque[JobRequest]] = {}
        for job in block:
            jobs = tenants.get(job.tenant)
            if jobs is None:
                jobs = tenants[job.tenant] = deque()
            jobs.append(job)
        if len(tenants) == 1:
            yield from next(iter(tenants.values()))
            continue
        heap = [_key(ledger, tenant, jobs[0]) for tenant, jobs in tenants.items()]
        heapq.heapify(heap)
        while heap:
            tenant = heapq.heappop(heap)[-1]
            jobs = tenants[tenant]
            popleft = jobs.popleft
            while True:
                version = ledger.version
                yield popleft()
                if not jobs:
                    break
                if ledger.version == version and not quotas_on:
                    continue  # nothing was placed: the tenant's key is unchanged, it is still the least
                key = _key(ledger, tenant, jobs[0])
                if heap and heap[0] < key:
                    heapq.heappush(heap, key)
                    break


def _key(ledger: QuotaLedger, tenant: str, job: JobRequest) -> tuple:
    return (ledger.would_borrow(job), ledger.dominant_share(tenant), tenant)
