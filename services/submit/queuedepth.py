"""How many jobs each tenant has waiting, and the limit on it: a tenant at its limit is refused (429) with an
estimate of when to try again.

A tenant's count is what the event store counted last (`count_by_tenant`, every `REFRESH_SECONDS`, on an index:
no document is read) plus the jobs this replica admitted since that count began. Asking it on every submit costs
a dict lookup; following the jobs costs nothing per event (no watch of the bus). A job counts from the moment a
submit reserves it (before its event is stored: concurrent submits never overshoot the limit). A job that left
the queue (placed, cancelled) counts until the next count, a reservation stored while a count runs is counted
twice until the next one: the count errs on the side of refusing, for at most a second. Another submit replica's
jobs count from the next count. With no limit set nothing is counted at all.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable

from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.stores.events import Projections

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0
DRAIN_WINDOW = 60  # seconds of departures from the queue the drain rate is measured over
RETRY_AFTER_UNKNOWN = 30  # seconds, when nothing left the tenant's queue in the window (nothing runs yet)
RETRY_AFTER_MAX = 600
QUEUED = [JobState.QUEUED.value]


class QueueFull(Exception):
    """A tenant has as many jobs waiting as it may: the request is refused, nothing is stored."""

    def __init__(self, tenant: str, queued: int, limit: int, retry_after: int, rate: float):
        self.tenant, self.queued, self.limit, self.retry_after = tenant, queued, limit, retry_after
        drain = f"about {rate:.3g} a second leave it" if rate else "none left it in the last minute"
        super().__init__(
            f"tenant {tenant!r} has {queued} jobs queued, its limit is {limit} ({drain}): "
            f"retry in {retry_after} s"
        )


class Drain:
    """Departures from one tenant's queue, counted per second over the last DRAIN_WINDOW seconds."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: deque[list[int]] = deque()  # [second, departures]

    def add(self, now: float, departures: int = 1) -> None:
        second = int(now)
        if self.seconds and self.seconds[-1][0] == second:
            self.seconds[-1][1] += departures
        else:
            self.seconds.append([second, departures])
        self._trim(second)

    def rate(self, now: float) -> float:
        """Departures a second over the window (0.0: none)."""
        self._trim(int(now))
        return sum(n for _, n in self.seconds) / DRAIN_WINDOW if self.seconds else 0.0

    def _trim(self, second: int) -> None:
        while self.seconds and self.seconds[0][0] <= second - DRAIN_WINDOW:
            self.seconds.popleft()


class QueueDepth:
    def __init__(
        self,
        limit: int = 0,
        per_tenant: dict[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`limit`: jobs a tenant may have queued (0: no limit); `per_tenant`: a tenant's own limit instead."""
        self.limit = limit
        self.per_tenant = {t: int(n) for t, n in (per_tenant or {}).items()}
        self.clock = clock
        self.counted: Counter[str] = Counter()  # tenant -> its queued jobs at the store's last count
        self.reserved: dict[str, list] = {}  # job id -> [tenant, when stored or None]: in no count yet
        self.pending: Counter[str] = Counter()  # tenant -> its part of `reserved`
        self.arrived: Counter[str] = Counter()  # tenant -> its jobs stored by this replica, ever
        self.drains: dict[str, Drain] = {}
        self._last: tuple[float, Counter[str]] | None = None  # (when the last count began, `arrived` then)

    @property
    def limited(self) -> bool:
        """Whether any tenant has a limit (else nothing needs counting)."""
        return bool(self.limit) or any(self.per_tenant.values())

    def limit_of(self, tenant: str) -> int:
        """The tenant's limit; 0: none."""
        return self.per_tenant.get(tenant, self.limit)

    def queued(self, tenant: str) -> int:
        return self.counted[tenant] + self.pending[tenant]

    # ------------------------------------------------------------------ a submit

    def admit(self, tenant: str, job_id: str) -> bool:
        """Count `job_id` as queued for `tenant` before its event is stored, or raise QueueFull. False: nothing
        reserved (no limit applies to the tenant, or the job is reserved already)."""
        limit = self.limit_of(tenant)
        if not limit or job_id in self.reserved:
            return False
        if self.queued(tenant) >= limit:
            raise self.full(tenant)
        self.reserved[job_id] = [tenant, None]
        self.pending[tenant] += 1
        return True

    def stored(self, job_id: str) -> None:
        """The reserved job's submission is in the store: the next count that begins after now includes it."""
        if (entry := self.reserved.get(job_id)) is not None and entry[1] is None:
            entry[1] = self.clock()
            self.arrived[entry[0]] += 1

    def release(self, job_id: str) -> None:
        """A reservation whose job was not stored (an error, a conflicting key, a repeat) counts no more."""
        entry = self.reserved.pop(job_id, None)
        if entry is not None:
            self.pending[entry[0]] -= 1

    def full(self, tenant: str) -> QueueFull:
        """The refusal for `tenant`, with Retry-After: the seconds its queue needs, at the rate it drained over
        the last minute, to have room for one more job."""
        queued, limit = self.queued(tenant), self.limit_of(tenant)
        drain = self.drains.get(tenant)
        rate = drain.rate(self.clock()) if drain else 0.0
        retry = math.ceil((queued - limit + 1) / rate) if rate else RETRY_AFTER_UNKNOWN
        return QueueFull(tenant, queued, limit, min(max(retry, 1), RETRY_AFTER_MAX), rate)

    # ------------------------------------------------------------------ the store's count

    async def refresh(self, store: Projections) -> None:
        """Take the store's count of every tenant's queued jobs. Reservations stored before it began are in it;
        the others stay on top of it. What left each queue since the last count gives its drain rate."""
        began, arrived = self.clock(), self.arrived.copy()
        counts = Counter(await store.count_by_tenant(states=QUEUED))
        for job_id, (tenant, stored_at) in list(self.reserved.items()):
            if stored_at is not None and stored_at < began:
                del self.reserved[job_id]
                self.pending[tenant] -= 1
        if self._last is not None:
            before, arrived_before = self._last
            for tenant in self.counted.keys() | counts.keys():
                left = self.counted[tenant] + arrived[tenant] - arrived_before[tenant] - counts[tenant]
                if left > 0:
                    self.drains.setdefault(tenant, Drain()).add(began, left)
        self.counted, self._last = counts, (began, arrived)

    async def follow(self, store: Projections, interval: float = REFRESH_SECONDS) -> None:
        """Count every `interval` while a limit applies; a store that cannot answer keeps the last count."""
        if not self.limited:
            return
        while True:
            try:
                await self.refresh(store)
            except Exception as exc:  # the store away for a while: the reservations still count
                log.warning("queue depth: cannot count the queued jobs: %s", exc)
            await asyncio.sleep(interval)
