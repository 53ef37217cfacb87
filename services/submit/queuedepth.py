"""How many jobs each tenant has waiting, and the limit on it: a tenant at its limit is refused (429) with an
estimate of when to try again.

The count is kept in memory from the job events (an ordered watch of `job.>`, started before the live jobs
are read from the event store), so asking it on every submit costs a dict lookup, not a store query. A job
counts from the moment a submit reserves it (before its event is stored: concurrent submits never overshoot
the limit) until it leaves the queue (placed or cancelled); a requeued job counts again. Memory holds one
entry per live job. A full re-read of the live jobs every `RESYNC_SECONDS` repairs anything an event
published out of order (by an outbox relay) could have left wrong.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable

from shared.bus import Bus
from shared.events import (
    EVENTS_STREAM,
    CloudEvent,
    JobCancelled,
    JobFailed,
    JobPlaced,
    JobRequeued,
    JobSubmitted,
    JobSucceeded,
    Wildcard,
)
from shared.jobstate import ACTIVE_STATES, JobState
from shared.store import EventStore

log = logging.getLogger(__name__)

RESYNC_SECONDS = 60.0
DRAIN_WINDOW = 60  # seconds of departures from the queue the drain rate is measured over
RETRY_AFTER_UNKNOWN = 30  # seconds, when nothing left the tenant's queue in the window (nothing runs yet)
RETRY_AFTER_MAX = 600
LIVE = [JobState.QUEUED.value, *(s.value for s in ACTIVE_STATES)]


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

    def add(self, now: float) -> None:
        second = int(now)
        if self.seconds and self.seconds[-1][0] == second:
            self.seconds[-1][1] += 1
        else:
            self.seconds.append([second, 1])
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
        self.queued: dict[str, str] = {}  # job id -> tenant: waiting to be placed
        self.active: dict[str, str] = {}  # job id -> tenant: placed or running (a requeue brings it back)
        self.counts: Counter[str] = Counter()  # tenant -> len of its part of `queued`
        self.drains: dict[str, Drain] = {}
        self._touched: set[str] | None = None  # jobs changed while the store is being read

    # ------------------------------------------------------------------ the limit

    def limit_of(self, tenant: str) -> int:
        """The tenant's limit; 0: none."""
        return self.per_tenant.get(tenant, self.limit)

    def admit(self, tenant: str, job_id: str) -> bool:
        """Count `job_id` as queued for `tenant` before its event is stored, or raise QueueFull. False: the job
        was already known (a retried submit), nothing reserved."""
        if job_id in self.queued or job_id in self.active:
            return False
        limit = self.limit_of(tenant)
        if limit and self.counts[tenant] >= limit:
            raise self.full(tenant)
        self._touch(job_id)
        self._queue(job_id, tenant)
        return True

    def release(self, job_id: str) -> None:
        """A reservation whose job was not stored (an error, a conflicting key) counts no more."""
        self._touch(job_id)
        self._unqueue(job_id)

    def full(self, tenant: str) -> QueueFull:
        """The refusal for `tenant`, with Retry-After: the seconds its queue needs, at the rate it drained over
        the last minute, to have room for one more job."""
        queued, limit = self.counts[tenant], self.limit_of(tenant)
        drain = self.drains.get(tenant)
        rate = drain.rate(self.clock()) if drain else 0.0
        retry = math.ceil((queued - limit + 1) / rate) if rate else RETRY_AFTER_UNKNOWN
        return QueueFull(tenant, queued, limit, min(max(retry, 1), RETRY_AFTER_MAX), rate)

    # ------------------------------------------------------------------ following the jobs

    def observe(self, event: CloudEvent) -> None:
        data, job_id = event.data, event.subject or ""
        if isinstance(data, JobSubmitted):
            self._touch(job_id)
            if job_id not in self.active:
                self._queue(job_id, data.tenant)
        elif isinstance(data, JobPlaced):
            self._touch(job_id)
            if (tenant := self._unqueue(job_id, departed=True)) is not None:
                self.active[job_id] = tenant
        elif isinstance(data, JobRequeued):
            self._touch(job_id)
            if (tenant := self.active.pop(job_id, None)) is not None:
                self._queue(job_id, tenant)
        elif isinstance(data, JobCancelled | JobFailed | JobSucceeded):
            self._touch(job_id)
            self._unqueue(job_id, departed=True)
            self.active.pop(job_id, None)

    async def on_event(self, event: CloudEvent, _msg) -> None:
        self.observe(event)

    async def follow(self, bus: Bus, store: EventStore) -> None:
        """Watch the job events from now on, then read the live jobs: nothing falls between the two."""
        await bus.watch(Wildcard.JOB.value, self.on_event, stream=EVENTS_STREAM.name)
        await self.load(store)

    async def resync(self, store: EventStore, interval: float = RESYNC_SECONDS) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.load(store)
            except Exception as exc:  # the store away for a while: the events still count
                log.warning("queue depth: cannot re-read the live jobs: %s", exc)

    async def load(self, store: EventStore) -> None:
        """The live jobs as the store has them; a job an event (or a submit) changed while reading keeps what
        that event said, being newer."""
        self._touched = touched = set()
        queued: dict[str, str] = {}
        active: dict[str, str] = {}
        try:
            cursor = None
            while True:
                page = await store.list_projections(states=LIVE, limit=500, cursor=cursor)
                for doc in page.items:
                    into = queued if doc["state"] == JobState.QUEUED.value else active
                    into[doc["job_id"]] = doc["tenant"]
                if not page.next_cursor:
                    break
                cursor = page.next_cursor
        finally:
            self._touched = None
        for job_id in touched:
            queued.pop(job_id, None)
            active.pop(job_id, None)
            if job_id in self.queued:
                queued[job_id] = self.queued[job_id]
            elif job_id in self.active:
                active[job_id] = self.active[job_id]
        self.queued, self.active = queued, active
        self.counts = Counter(queued.values())

    # ------------------------------------------------------------------ bookkeeping

    def _touch(self, job_id: str) -> None:
        if self._touched is not None:
            self._touched.add(job_id)

    def _queue(self, job_id: str, tenant: str) -> None:
        if job_id not in self.queued:
            self.queued[job_id] = tenant
            self.counts[tenant] += 1

    def _unqueue(self, job_id: str, *, departed: bool = False) -> str | None:
        tenant = self.queued.pop(job_id, None)
        if tenant is not None:
            self.counts[tenant] -= 1
            if not self.counts[tenant]:
                del self.counts[tenant]
            if departed:
                self.drains.setdefault(tenant, Drain()).add(self.clock())
        return tenant
