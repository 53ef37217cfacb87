"""The platform's figures for /metrics: jobs by state and tenant, each tenant's queue (length, oldest wait),
its quota (guaranteed, used, borrowed GPUs), the jobs that ended, and a histogram of the wait from submit to
running. The placed and running jobs come from the live jobs (`services/monitor/jobs.py`), the queues from the
store's counts (`EventStore.count_by_tenant`, `oldest_by_tenant`: no queued job is walked), the ends from the
feed of ends (`services/monitor/ended.py`).

`PlatformFigures.update` makes a new `PlatformSnapshot` after each refresh of the jobs; /metrics renders the
latest snapshot (one object swapped whole, so a scrape in another thread never sees half of one).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client.utils import floatToGoString

from gpuyard.services.monitor.jobs import LiveJob, LiveJobs
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.reporting.quotause import NOTHING, Holding, held_gpus, quota_use
from gpuyard.shared.stores.events import EndedJob

START_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0)
"""Seconds: the upper bounds of the submit→running histogram (+Inf after them)."""


@dataclass
class Histogram:
    """Cumulative counts per upper bound, their sum and count: what Prometheus' histogram type carries."""

    bounds: tuple[float, ...] = START_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(START_BUCKETS) + 1))
    total: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, value: float) -> None:
        with self.lock:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.total += value

    def buckets(self) -> tuple[list[tuple[str, int]], float]:
        """([(le, cumulative count)...] ending with +Inf, sum)."""
        with self.lock:
            counts, total = list(self.counts), self.total
        out, running = [], 0
        for bound, count in zip([*map(floatToGoString, self.bounds), "+Inf"], counts, strict=True):
            running += count
            out.append((bound, running))
        return out, total


@dataclass(frozen=True)
class TenantQueue:
    length: int
    oldest_wait_seconds: float


@dataclass(frozen=True)
class TenantQuota:
    guaranteed: float
    used: float
    borrowed: float


@dataclass(frozen=True)
class PlatformSnapshot:
    jobs: dict[tuple[str, str], int]
    """(state, tenant) -> live jobs."""
    queues: dict[str, TenantQueue]
    quotas: dict[str, TenantQuota]
    ended: dict[tuple[str, str], int]
    """(state, tenant) -> jobs that ended since the monitor started."""
    taken_at: datetime


EMPTY = PlatformSnapshot({}, {}, {}, {}, datetime.fromtimestamp(0, UTC))


class PlatformFigures:
    def __init__(self, quotas: dict[str, float]):
        self.guaranteed = dict(quotas)
        self.start_wait = Histogram()
        self.ended: Counter[tuple[str, str]] = Counter()
        self.snapshot = EMPTY

    def started(self, job: LiveJob) -> None:
        """`LiveJobs.on_started`: a job's wait from submit to running."""
        if job.started_at is not None:
            self.observe_start(job.submitted_at, job.started_at)

    def job_ended(self, job: EndedJob, *, start_seen: bool) -> None:
        """`EndedFeed.on_ended`; `start_seen`: its start was told to `started` (or it ran before the monitor
        began), else it is told here, if the job ran (it ran whole between two refreshes of the live jobs)."""
        self.ended[(job.state, job.tenant)] += 1
        if not start_seen and job.started_at is not None:
            self.observe_start(
                datetime.fromisoformat(job.submitted_at), datetime.fromisoformat(job.started_at)
            )

    def observe_start(self, submitted_at: datetime, started_at: datetime) -> None:
        self.start_wait.observe(max(0.0, (started_at - submitted_at).total_seconds()))

    def update(
        self,
        jobs: LiveJobs,
        queued: dict[str, int],
        oldest: dict[str, str],
        now: datetime | None = None,
    ) -> PlatformSnapshot:
        """`queued`, `oldest`: tenant -> its queued jobs, and when its oldest was created (the store's)."""
        now = now or datetime.now(UTC)
        counts: Counter[tuple[str, str]] = Counter()
        holdings: list[Holding] = []
        for job in list(jobs.jobs.values()):
            if job.state != JobState.QUEUED:  # (the queued jobs held for the waiting alert: counted below)
                counts[(job.state.value, job.tenant)] += 1
                holdings.append(Holding(job.tenant, held_gpus(job.placements), job.borrowed))
        queues = {}
        for tenant, length in queued.items():
            counts[(JobState.QUEUED.value, tenant)] = length
            first = datetime.fromisoformat(oldest[tenant]) if tenant in oldest else now
            queues[tenant] = TenantQueue(length, max(0.0, (now - first).total_seconds()))
        use = quota_use(holdings)
        quotas = {
            t: TenantQuota(
                self.guaranteed.get(t, 0.0), use.get(t, NOTHING).used, use.get(t, NOTHING).borrowed
            )
            for t in set(self.guaranteed) | set(use)
        }
        self.snapshot = PlatformSnapshot(dict(counts), queues, quotas, dict(self.ended), now)
        return self.snapshot
