"""Where every ready replica is, across the nodes: what each serving service learns from `model.ready` and
`model.failed` and from the end of the serve jobs (`job.cancelled`, `failed`, `succeeded`, `requeued`), so that
a request for a model this node does not hold goes through one hop to a node that holds it.

The table is kept from the events stream (`follow`): the model events from the stream's start (a replica
announced before this service started is known), the jobs' ends from now on; and now and then (`prune_every`)
the replicas whose job is no longer running in the event store are dropped (a replayed `model.ready` of a job
that ended long ago, an end that was missed). A replica on this node is in the table too (this service's
own `model.ready`), but the local registry answers for it first."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property

from gpuyard.services.serving.held import model_key
from gpuyard.shared.bus.headers import entity_of
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobFailed, JobRequeued, JobSucceeded
from gpuyard.shared.contracts.events.models import (
    ModelDeleted,
    ModelFailed,
    ModelPublished,
    ModelReady,
    ModelVisibilityChanged,
)
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM, Subject, Wildcard, subject_filter
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.runtime.handlers import HandlerTable

log = logging.getLogger(__name__)

JOB_ENDS = (Subject.JOB_CANCELLED, Subject.JOB_FAILED, Subject.JOB_SUCCEEDED, Subject.JOB_REQUEUED)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Route:
    job_id: str
    key: str
    """The model's registry key (`model_key`: tenant/name)."""
    version: int
    node: str
    endpoint: str


class Routes:
    def __init__(self, node: str):
        self.node = node
        self.by_job: dict[str, Route] = {}
        self._by_key: dict[str, dict[int, list[Route]]] = {}
        self._turn = itertools.count()
        self.on_model_change: Callable[[str, str], None] | None = None
        """Called with (tenant, name) when a model is published, shared or deleted (the access cache)."""

    # ------------------------------------------------------------------ learning

    def ready(self, data: ModelReady) -> None:
        self.gone(data.job_id)
        route = Route(data.job_id, model_key(data.tenant, data.name), data.version, data.node, data.endpoint)
        self.by_job[data.job_id] = route
        self._by_key.setdefault(route.key, {}).setdefault(route.version, []).append(route)

    def gone(self, job_id: str) -> None:
        route = self.by_job.pop(job_id, None)
        if route is None:
            return
        versions = self._by_key.get(route.key, {})
        held = versions.get(route.version, [])
        if route in held:
            held.remove(route)
        if not held:
            versions.pop(route.version, None)
        if not versions:
            self._by_key.pop(route.key, None)

    @cached_property
    def handlers(self) -> HandlerTable:
        """What it learns from each event it follows."""
        return HandlerTable(
            {
                ModelReady: self.on_ready,
                (ModelFailed, JobCancelled, JobFailed, JobSucceeded, JobRequeued): self.on_gone,
                (ModelPublished, ModelVisibilityChanged, ModelDeleted): self.on_model_changed,
            }
        )

    async def on_ready(self, data: ModelReady, _event: CloudEvent) -> None:
        self.ready(data)

    async def on_gone(
        self, data: ModelFailed | JobCancelled | JobFailed | JobSucceeded | JobRequeued, _event: CloudEvent
    ) -> None:
        self.gone(data.job_id)

    async def on_model_changed(
        self, data: ModelPublished | ModelVisibilityChanged | ModelDeleted, _event: CloudEvent
    ) -> None:
        if self.on_model_change is not None:
            self.on_model_change(data.tenant, data.name)

    def routes_job(self, msg) -> bool:
        job_id = entity_of(msg)
        return job_id is None or job_id in self.by_job

    async def follow(self, bus) -> None:
        """Learn from the events stream: the jobs' ends from now on, the model events since the stream's
        start (replayed in the background)."""
        await bus.watch(
            [subject_filter(subject) for subject in JOB_ENDS],
            self.handlers,
            stream=EVENTS_STREAM.name,
            wanted=self.routes_job,  # every job's end comes: only those of the replicas it routes to are read
            name="serving-routes-job-ends",
        )
        await bus.watch(
            Wildcard.MODEL.value,
            self.handlers,
            stream=EVENTS_STREAM.name,
            since=EPOCH,
            name="serving-routes-models",
        )

    async def prune(self, running: Callable[[list[str]], Awaitable[set[str]]]) -> None:
        """Forget the replicas whose job is not running (`running`: those of the given job ids that are, in
        the event store): those the replay of old `model.ready` events brought back, and any whose end was
        missed."""
        jobs = list(self.by_job)
        if not jobs:
            return
        alive = await running(jobs)
        for job_id in jobs:
            if job_id not in alive:
                self.gone(job_id)

    async def prune_every(
        self, running: Callable[[list[str]], Awaitable[set[str]]], interval: float, first: float = 2.0
    ) -> None:
        await asyncio.sleep(first)
        while True:
            try:
                await self.prune(running)
            except Exception as exc:  # the store unavailable a moment: next round
                log.warning("routes: cannot check the replicas' jobs: %s", exc)
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ finding

    def holds(self, key: str) -> bool:
        return key in self._by_key

    def versions(self, key: str) -> list[int]:
        return sorted(self._by_key.get(key, {}))

    def remote(self, key: str, version: int) -> Route | None:
        """A replica of the version on another node, taking turns among them; None when there is none."""
        routes = [r for r in self._by_key.get(key, {}).get(version, []) if r.node != self.node]
        if not routes:
            return None
        return routes[next(self._turn) % len(routes)]


def running_in(store) -> Callable[[list[str]], Awaitable[set[str]]]:
    """`Routes.prune`'s `running` over the event store: those of the given jobs whose projection says running."""

    async def running(job_ids: list[str]) -> set[str]:
        alive = set()
        for job_id in job_ids:
            doc = await store.get_projection(job_id)
            if doc is not None and doc.get("state") == JobState.RUNNING:
                alive.add(job_id)
        return alive

    return running
