"""The live scheduler: it keeps its view of the jobs and nodes up to date, leads or follows, and runs a cycle of
the pure core after every burst of events and on a timer.

Several replicas may run; one leads at a time (a lease in NATS KV, `gpuyard.shared.runtime.lease`). Every
replica follows the events (`handlers.py`); only the leader decides, and records its decisions
(`decisions.py`) and what it does about nodes (`nodecontrols.py`). A replica that becomes leader re-reads the
live jobs from the event store first, and every replica re-reads them every `resync_interval` as well, so a
missed event can only delay a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpuyard.services.scheduler.decisions import DecisionRecorder
from gpuyard.services.scheduler.heartbeats import HeartbeatIntake
from gpuyard.services.scheduler.nodecontrols import NodeControls
from gpuyard.services.scheduler.view import ClusterView
from gpuyard.shared.contracts.jobstate import LIVE_STATES, JobView, state_values
from gpuyard.shared.runtime.lease import Lease
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.scheduling.cycle import decide
from gpuyard.shared.scheduling.model import SchedulerConfig
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.ledger import JobLedger

log = logging.getLogger(__name__)
MIN_GATHER_SECONDS = 0.002
MAX_GATHER_SECONDS = 0.05
CYCLE_SHARE = 3


def gather_window(decide_seconds: float) -> float:
    """How long the next cycle waits for events to gather after the first one wakes it: a few milliseconds,
    or longer after a long decision (a long queue behind a full cluster), so that the scheduler spends at most
    about 1/(CYCLE_SHARE + 1) of its time deciding and each cycle places what several ended jobs freed. Only
    `decide` counts: it is the part a cycle costs whatever it places. Reading the jobs that changed and
    recording the placements cost the same however the events are gathered; counted in, they would space the
    cycles of a fast drain out for nothing (with 20,000 jobs queued: 100 ms apart instead of 40)."""
    return min(MAX_GATHER_SECONDS, max(MIN_GATHER_SECONDS, CYCLE_SHARE * decide_seconds))


def config_of(settings: SchedulerSettings) -> SchedulerConfig:
    return SchedulerConfig(
        policy=settings.policy,
        fair_share=settings.fair_share,
        tenant_weights=dict(settings.tenant_weights),
        user_gpu_cap=dict(settings.user_gpu_cap),
        borrowing=settings.borrowing,
        preemption=settings.preemption,
        min_runtime_before_preemption=settings.min_runtime_before_preemption,
        backfill=settings.backfill,
        reservation_depth=settings.reservation_depth,
        short_first_window=settings.short_first_window,
        shape_reservations=settings.shape_reservations,
    )


class SchedulerService:
    """The live scheduler: holds the view, leads or follows, runs `decide` on the held cluster and has what it
    decides recorded."""

    def __init__(self, service: Service, settings: SchedulerSettings):
        self.service = service
        self.settings = settings
        self.ledger: JobLedger = service.ledger
        self.config = config_of(settings)
        self.view = ClusterView()
        self.dirty: set[str] = set()  # jobs to read again from the event store (`refresh_dirty`)
        self.wake = asyncio.Event()
        self.leading = asyncio.Event()
        self.gather_seconds = MIN_GATHER_SECONDS
        self.heartbeats = HeartbeatIntake(self.view)
        self.decisions = DecisionRecorder(service, settings, self.view, self.config.policy)
        self.node_controls = NodeControls(service, settings, self.view)
        bus = service.bus
        self.lease = Lease(bus, "scheduler", settings.instance, ttl=settings.lease_ttl, replicas=bus.replicas)

    async def load(self) -> None:
        """Re-read the live jobs from the event store (a restarted or new leader forgets nothing)."""
        listed: set[str] = set()
        cursor = None
        while True:
            page = await self.service.store.list_projections(
                states=state_values(LIVE_STATES), limit=500, cursor=cursor
            )
            for doc in page.items:
                view = JobView.model_validate(doc)
                listed.add(view.job_id)
                self.view.put_job(view)
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        self.dirty |= set(self.view.jobs) - listed  # ended (or changed) since: the ledger will say
        await self.refresh_dirty()
        await self.node_controls.load()

    async def resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_interval)
            await self.recheck()
            await self.node_controls.load()  # (a control the bus did not bring, a job placed as one arrived)
            self.wake.set()

    async def recheck(self) -> None:
        """Compare the version of every live job with the event store's and read again only the jobs that
        differ, are missing, or ended meanwhile: a missed event is repaired, and a resync with 20,000 jobs
        waiting decodes none of them."""
        stored = await self.service.store.versions(states=state_values(LIVE_STATES))
        held = self.view.jobs
        self.dirty.update(
            job_id for job_id, version in stored.items() if version != _version(held.get(job_id))
        )
        self.dirty.update(held.keys() - stored.keys())
        await self.refresh_dirty()

    async def gained(self) -> None:
        await self.load()
        log.info("leading; %d live jobs in the event store", len(self.view.jobs))
        self.decisions.pending_sent.clear()
        self.leading.set()
        self.wake.set()

    async def lost(self) -> None:
        self.leading.clear()

    async def refresh_dirty(self) -> None:
        """Bring the jobs that events were seen for up to date (the ledger reads only their new events)."""
        dirty, self.dirty = self.dirty, set()
        for view in await asyncio.gather(*(self.ledger.load(job_id) for job_id in dirty)):
            if view is not None:
                self.view.put_job(view)

    async def run(self) -> None:
        """Cycle until the service stops (within one cycle_interval of SIGTERM)."""
        while not self.service.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.settings.cycle_interval)
            await asyncio.sleep(self.gather_seconds)  # a burst of events gathers: one cycle for all of them
            self.wake.clear()
            await self.cycle()

    async def cycle(self) -> None:
        """Bring the view up to date; the leader then decides, a follower keeps its view warm and decides
        nothing (and forgets, as the leader's cycle does, what left the queue)."""
        await self.refresh_dirty()
        if not self.leading.is_set():
            self.decisions.forget_left()
            self.view.waiting.prepare()
            return
        await self.node_controls.check_lost()
        await self.node_controls.act()
        await self.decide_and_record()

    async def decide_and_record(self) -> None:
        """One cycle of the core on the held cluster, and its decisions recorded."""
        now = time.time()
        self.decisions.forget_left()
        queue = self.view.waiting
        queue.prepare()
        if not queue:
            self.gather_seconds = MIN_GATHER_SECONDS
            await self.decisions.store_line({}, now)
            return  # nothing waits: nothing to place, and preemption is only ever for a waiting job
        held = self.view.held
        began = time.perf_counter()
        index = held.index()
        result = decide(
            index, held.allocations(), queue, self.config, dict(self.settings.quotas), now, held.kinds
        )
        held.decided(result)
        self.gather_seconds = gather_window(time.perf_counter() - began)
        await self.decisions.apply(result, now)


def _version(job: JobView | None) -> int:
    return job.version if job is not None else 0
