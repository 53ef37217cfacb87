"""The live jobs and the platform figures, brought up to date every `jobs_interval`: the live jobs re-read
what changed (`jobs.py`); a cluster-scope monitor then tells the platform figures (`platform.py`) the jobs that
ended since (`ended.py`) and the queues' lengths and oldest waits (the store's counts: no queued job is
walked).
"""

from __future__ import annotations

import asyncio
import logging

from gpuyard.services.monitor.ended import EndedFeed
from gpuyard.services.monitor.jobs import LiveJobs
from gpuyard.services.monitor.platform import PlatformFigures
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.stores.events import EndedJob, Projections

log = logging.getLogger(__name__)


class JobsRefresher:
    def __init__(self, store: Projections, jobs: LiveJobs, interval: float, figures: PlatformFigures | None):
        """`figures`: the platform figures to keep (None: the live jobs only)."""
        self.store = store
        self.jobs = jobs
        self.interval = interval
        self.figures = figures
        self.ends = EndedFeed(store, self.job_ended) if figures is not None else None

    async def run(self) -> None:
        """Refresh every `interval` until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # the store away for a moment: the next refresh catches up
                log.warning("reading the live jobs failed: %s", exc)
            await asyncio.sleep(self.interval)

    async def refresh(self) -> None:
        await self.jobs.refresh()
        if self.figures is not None and self.ends is not None:
            await self.ends.poll()
            queued = [JobState.QUEUED.value]
            counts = await self.store.count_by_tenant(states=queued)
            oldest = await self.store.oldest_by_tenant(states=queued)
            self.figures.update(self.jobs, counts, oldest)

    def job_ended(self, job: EndedJob) -> None:
        assert self.figures is not None
        self.figures.job_ended(job, start_seen=self.jobs.ended(job.stream_id))
