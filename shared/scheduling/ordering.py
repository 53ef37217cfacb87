"""The order in which waiting jobs are considered.

Higher priority class first. Inside a class, with fair share on: the tenant whose next job stays within its
guarantee before a tenant that would borrow, then the smallest weighted dominant share (DRF over GPUs, CPUs
and memory, updated after every placement), then the tenant name; each tenant's own jobs go in line order:
oldest first (submitted_at, then job id), but with a short-first window W
(`SchedulerConfig.short_first_window`) a job's place is its arrival plus min(its time limit, W)
(`queue.line_order`). With fair share off: (priority, line order).

The jobs come from a `queue.HeldQueue`, which keeps each class and each tenant's jobs in arrival order between
cycles: nothing is sorted here. `Order.rest()` says, at any point, which jobs are left and in what order,
provided nothing more is placed (the ledger no longer changes): a cycle that knows the answer for all of them
stops there.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from operator import attrgetter
from typing import cast

from gpuyard.shared.scheduling.model import JobRequest
from gpuyard.shared.scheduling.queue import HeldQueue
from gpuyard.shared.scheduling.quota import QuotaLedger

_PRIORITY = attrgetter("priority")


class Order:
    """Yields jobs one at a time; the ledger must be updated before asking for the next one."""

    def __init__(self, queue: HeldQueue, ledger: QuotaLedger, fair_share: bool) -> None:
        self.queue = queue
        self.ledger = ledger
        self.fair_share = fair_share
        self._classes = list(queue.classes)  # priorities, high first
        self._next_class = 0
        # this class: tenant -> its jobs (or None -> the class's)
        self._lists: dict[str | None, list[JobRequest]] = {}
        self._at: dict[str | None, int] = {}  # ... and how many of them were yielded
        self._heap: list[tuple] = []
        self._current: str | None = None  # the tenant being served (fair share)
        self._priority: int | None = None

    def __iter__(self) -> Iterator[JobRequest]:
        ledger = self.ledger
        quotas_on = ledger.quotas_on
        at = self._at
        for priority in self._classes:
            self._next_class += 1
            self._priority = priority
            if not self.fair_share or len(self.queue.tenants[priority]) == 1:
                jobs = self.queue.classes[priority]
                self._lists, self._heap, self._current = {None: jobs}, [], None
                at[None] = 0
                for job in jobs:
                    at[None] += 1
                    yield job
                continue
            tenants = self.queue.tenants[priority]
            # (only read through `_lists`, which never puts a None key in the queue's own table)
            self._lists = cast("dict[str | None, list[JobRequest]]", tenants)
            at.clear()
            for tenant in tenants:
                at[tenant] = 0
            heap = self._heap = [_key(ledger, tenant, jobs[0]) for tenant, jobs in tenants.items()]
            heapq.heapify(heap)
            while heap:
                tenant = self._current = heapq.heappop(heap)[-1]
                jobs = tenants[tenant]
                n = len(jobs)
                while True:
                    version = ledger.version
                    k = at[tenant]
                    at[tenant] = k + 1
                    yield jobs[k]
                    if k + 1 == n:
                        break
                    if ledger.version == version and not quotas_on:
                        continue  # nothing was placed: the tenant's key is unchanged, it is still the least
                    key = _key(ledger, tenant, jobs[k + 1])
                    if heap and heap[0] < key:
                        heapq.heappush(heap, key)
                        break
            self._current = None

    def rest(self) -> list[tuple[list[JobRequest], int, tuple]]:
        """The jobs not yielded yet, in the order they would come if nothing more were placed (and no quotas:
        see `cycle._Cycle.simple`): [(jobs, from, (priority, tenant or None))]."""
        out: list[tuple[list[JobRequest], int, tuple[int, str | None]]] = []
        priority = self._priority
        if priority is not None:
            if None in self._lists:
                out.append((self._lists[None], self._at[None], (priority, None)))
            else:
                if self._current is not None:
                    out.append(
                        (self._lists[self._current], self._at[self._current], (priority, self._current))
                    )
                for key in sorted(self._heap):
                    tenant = key[-1]
                    out.append((self._lists[tenant], self._at[tenant], (priority, tenant)))
        for priority in self._classes[self._next_class :]:
            tenants = self.queue.tenants[priority]
            if not self.fair_share or len(tenants) == 1:
                if self.fair_share:
                    [(tenant, jobs)] = tenants.items()
                    out.append((jobs, 0, (priority, tenant)))
                else:
                    out.append((self.queue.classes[priority], 0, (priority, None)))
                continue
            for key in sorted(_key(self.ledger, tenant, jobs[0]) for tenant, jobs in tenants.items()):
                out.append((tenants[key[-1]], 0, (priority, key[-1])))
        return [(jobs, start, owner) for jobs, start, owner in out if start < len(jobs)]


def in_order(queue: list[JobRequest], ledger: QuotaLedger, fair_share: bool) -> Iterator[JobRequest]:
    """The order of a plain list of jobs (see `Order`)."""
    return iter(Order(HeldQueue(queue), ledger, fair_share))


def _key(ledger: QuotaLedger, tenant: str, job: JobRequest) -> tuple:
    return (ledger.would_borrow(job), ledger.dominant_share(tenant), tenant)
