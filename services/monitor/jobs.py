"""The live jobs: those placed or running, and the queued jobs old enough to concern the job-waiting alert;
kept from the event store by what changed.

Every `refresh` asks the store for the version of each of those jobs (`EventStore.versions`: ids and numbers,
no document decoded) and reads again only the jobs that are new or whose version moved. A job still queued is
not read again when only its version moved (what the monitor keeps of a queued job does not change while it
waits: the scheduler's `job.pending` updates move its version). A job that left those states is dropped
unread: how jobs end comes from the store's feed of ends (`services/monitor/ended.py`), which also sees the
jobs this view never held (cancelled while they waited, or run whole between two refreshes).

A queued job is held only once it was created `waiting_after` seconds ago (the job-waiting rule's `for`; None:
no queued job is held), so a refresh costs work in the jobs that hold resources and in those the alert may
concern, never in the depth of the queue: the queues' lengths and oldest waits are the store's counts
(`services/monitor/platform.py`). From it come the holders of this node's GPUs (the placements of its placed
and running jobs) and the platform figures.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import GpuHolder
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobState, JobView, state_values
from gpuyard.shared.reporting.quotause import held_gpus
from gpuyard.shared.stores.events import Projections

log = logging.getLogger(__name__)

QUEUED_STATES = [JobState.QUEUED.value]
HOLDING_STATES = state_values(ACTIVE_STATES)
READS_AT_ONCE = 16
READS_PER_REFRESH = 1000
"""Most jobs read at one refresh: after a burst of submissions the view catches up over a few refreshes."""


@dataclass(frozen=True, slots=True)
class LiveJob:
    """What the monitor keeps of one live job."""

    job_id: str
    tenant: str
    user: str
    name: str
    state: JobState
    attempt: int
    submitted_at: datetime
    started_at: datetime | None
    """When its first attempt started running (None: not yet)."""
    since: datetime
    """Queued: when its current attempt was queued; placed or running: when it was placed or started."""
    borrowed: bool
    placements: tuple[ReplicaPlacement, ...]
    replicas: int
    serves: bool
    """A serve job (a model's replica): idle between requests is not stuck."""
    idle_timeout: float | None = None
    """Its spec's `idle_timeout` (None: its tenant's default; 0: never stopped for idle GPUs)."""
    idle_grace: float | None = None
    dev: bool = False
    """A dev environment: its user's activity (`dev.activity`) counts as busy for the idle reclaim."""

    @classmethod
    def of(cls, view: JobView) -> LiveJob:
        first = view.attempts[0] if view.attempts else None
        current = view.attempts[-1] if view.attempts else None
        if current is None:
            since = view.created_at
        elif view.state == JobState.QUEUED:
            since = current.queued_at
        else:
            since = current.started_at or view.updated_at
        return cls(
            job_id=view.job_id,
            tenant=view.tenant,
            user=view.user,
            name=view.name,
            state=view.state,
            attempt=view.attempt,
            submitted_at=first.queued_at if first else view.created_at,
            started_at=first.started_at if first else None,
            since=since,
            borrowed=view.borrowed,
            placements=tuple(view.placements) if view.state != JobState.QUEUED else (),
            replicas=view.spec.replicas,
            serves=view.spec.serve is not None,
            idle_timeout=view.spec.idle_timeout,
            idle_grace=view.spec.idle_grace,
            dev=view.spec.dev is not None,
        )

    @property
    def gpus(self) -> float:
        """The GPUs its placement holds (shares counted as their fraction)."""
        return held_gpus(self.placements)


@dataclass(frozen=True, slots=True)
class HeldGpu:
    """One replica's hold on one GPU of the node."""

    gpu_index: int
    holder: GpuHolder
    attempt: int


class LiveJobs:
    """The live jobs of the whole platform, refreshed from the store (`refresh`, every few seconds)."""

    def __init__(
        self,
        store: Projections,
        *,
        on_started: Callable[[LiveJob], None] | None = None,
        reads_per_refresh: int = READS_PER_REFRESH,
        waiting_after: float | None = None,
    ):
        """`on_started(job)`: a job seen to start running (its first attempt) while the view watched; whoever
        passes it tells `ended` of every job that ends. `waiting_after`: hold the queued jobs created at least
        this many seconds ago (None: none)."""
        self.store = store
        self.on_started = on_started
        self.reads_per_refresh = reads_per_refresh
        self.waiting_after = waiting_after
        self.versions: dict[str, int] = {}
        self.jobs: dict[str, LiveJob] = {}
        self.refreshed = False
        self._started_seen: set[str] = set()  # told to on_started (or running when the view began), not ended
        self._held: dict[str, list[HeldGpu]] = {}  # node -> its holds, until the jobs change

    async def refresh(self) -> None:
        holding = await self.store.versions(states=HOLDING_STATES)
        queued: dict[str, int] = {}
        if self.waiting_after is not None:
            cutoff = datetime.now(UTC) - timedelta(seconds=self.waiting_after)
            queued = await self.store.versions(states=QUEUED_STATES, created_before=cutoff.isoformat())
        current = {**queued, **holding}
        gone = [job_id for job_id in self.versions if job_id not in current]
        for job_id in gone:  # (placed, running or queued no more: dropped unread)
            del self.versions[job_id]
            self.jobs.pop(job_id, None)
        changed = [
            job_id
            for job_id, v in current.items()
            if self.versions.get(job_id) != v
            and not (job_id in queued and (known := self.jobs.get(job_id)) and known.state == JobState.QUEUED)
        ][: self.reads_per_refresh]
        limit = asyncio.Semaphore(READS_AT_ONCE)

        async def read(job_id: str) -> JobView | None:
            async with limit:
                doc = await self.store.get_projection(job_id)
            if doc is None:
                return None
            try:
                return JobView.model_validate(doc)
            except ValidationError as exc:
                log.warning("job %s: its stored view cannot be read: %s", job_id, exc)
                return None

        views = await asyncio.gather(*(read(job_id) for job_id in changed))
        first = not self.refreshed
        if gone or changed:
            self._held.clear()
        for job_id, view in zip(changed, views, strict=True):
            if view is None or view.state.terminal:  # (ended since it was listed: the feed of ends tells)
                self.versions.pop(job_id, None)
                self.jobs.pop(job_id, None)
                continue
            job = LiveJob.of(view)
            self.versions[job_id] = view.version or current[job_id]
            self.jobs[job_id] = job
            self._saw_start(job, quiet=first)
        self.refreshed = True

    def ended(self, job_id: str) -> bool:
        """Forget a job that ended (the feed of ends says so); True when its start was seen here (told to
        `on_started`, or already running when the view began)."""
        if job_id in self._started_seen:
            self._started_seen.discard(job_id)
            return True
        return False

    def _saw_start(self, job: LiveJob, *, quiet: bool) -> None:
        """Tell `on_started` once per job, unless it was already running when the view began (`quiet`); the
        job is kept as seen until `ended` forgets it (without `on_started`, nothing is kept)."""
        if self.on_started is None or job.started_at is None or job.job_id in self._started_seen:
            return
        self._started_seen.add(job.job_id)
        if not quiet:
            self.on_started(job)

    def held_on(self, node: str) -> list[HeldGpu]:
        """Every GPU (or share) of `node` held by a placed or running job's replica."""
        cached = self._held.get(node)
        if cached is not None:
            return cached
        held = self._held[node] = []
        for job in self.jobs.values():
            for placement in job.placements:
                if placement.node != node:
                    continue
                for share in placement.gpus:
                    holder = GpuHolder(
                        job_id=job.job_id,
                        tenant=job.tenant,
                        user=job.user,
                        replica=placement.replica,
                        fraction=share.fraction,
                        memory_bytes=share.memory_bytes,
                    )
                    held.append(HeldGpu(share.index, holder, job.attempt))
        return held
