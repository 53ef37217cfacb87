"""The scheduler's memory stays flat: after thousands of jobs have come and gone, nothing it keeps per job
(its view, the core's held cluster and queue, the ledger's cache and turns, the reasons it sent) holds a
finished job, for the leader and for a follower alike, but the ledger's few that ended last (a fixed number)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.jobs import JobStarted, JobSubmitted, JobSucceeded
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import ENDED_JOBS, Decision, JobLedger
from tests.unit.services.containers import containers

JOBS = 2000  # four times the ended jobs the ledger keeps (ENDED_JOBS)
BURST = 100
SMALL = 16
"""Containers that do not grow with the jobs stay below this (the node, the policy's tables)."""
PER_GPU_STATE = "scheduler.view.held._index.states"
"""The interned GPU states of nodes (`scheduling/gpustate.py`): one per distinct (model, free share of each GPU),
whatever the number of jobs that made it."""


def node() -> NodeHeartbeat:
    gpus = [GpuInfo(index=k, uuid=f"GPU-{k}", model="SIM", memory_bytes=1 << 34) for k in range(8)]
    return NodeHeartbeat(node="node-a", gpus=gpus, cpus=256, memory_bytes=1 << 40, simulated=True)


async def test_no_finished_job_stays_in_the_scheduler_after_2000_jobs(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    others = JobLedger(store, None, "/test/others")  # the submit service and the executor
    schedulers = []
    for _ in range(2):
        service = SimpleNamespace(
            store=store,
            ledger=JobLedger(store, None, "/test/scheduler"),
            bus=SimpleNamespace(js=None, replicas=1),
            source="/test/scheduler",
            stopping=asyncio.Event(),
        )
        scheduler = SchedulerService(service, SchedulerSettings(pending_after=0))
        scheduler.view.observe_node(node())
        schedulers.append(scheduler)
    leader, follower = schedulers
    handlers = [SchedulerHandlers(scheduler) for scheduler in schedulers]
    leader.leading.set()
    seen: dict[str, int] = {}

    async def deliver(job_ids) -> None:
        """Every event stored since the last delivery, to both, as their watch of the bus would."""
        for job_id in job_ids:
            for stored in await store.read_stream(job_id, after_version=seen.get(job_id, 0)):
                event = stored.event  # (what its watch reads of it: job, id and kind)
                for handler in handlers:
                    handler.job_changed(event.subject, event.id, event.nats_subject)
                seen[job_id] = stored.version
        for scheduler in schedulers:
            await scheduler.refresh_dirty()

    spec = JobSpec(command="true", resources={"gpus": 0.125, "cpus": 1, "memory": "1GiB"})
    for start in range(0, JOBS, BURST):
        for (
            scheduler
        ) in schedulers:  # the node's heartbeat, as it comes every few seconds (a slow run keeps it)
            scheduler.view.observe_node(node())
        batch = [f"job-{k:05d}" for k in range(start, start + BURST)]
        await others.record_many(
            [
                Decision(j, lambda _v, j=j: JobSubmitted(job_id=j, name=j, tenant="t", user="u", spec=spec))
                for j in batch
            ],
            new=True,
        )
        await deliver(batch)
        while leader.view.jobs:
            await leader.decide_and_record()
            await deliver(batch)
            placed = [v for v in leader.view.jobs.values() if v.state == JobState.PLACED]
            await others.record_many(
                [
                    Decision(
                        v.job_id,
                        lambda v: JobStarted(job_id=v.job_id, attempt=v.attempt, node="node-a", replicas=[0]),
                        then=lambda v: JobSucceeded(job_id=v.job_id, attempt=v.attempt),
                    )
                    for v in placed
                ]
            )
            await deliver(batch)
    assert (await store.get_projection(f"job-{JOBS - 1:05d}"))["state"] == "succeeded"
    for scheduler in schedulers:  # the timer's next cycle (a follower's keeps its view only)
        await scheduler.cycle()

    for scheduler in schedulers:
        sizes = containers(
            scheduler,
            "scheduler",
            ("gpuyard.services.scheduler", "gpuyard.shared.scheduling", "gpuyard.shared.stores.ledger"),
            4,
        )
        assert "scheduler.view.held._on" in sizes  # the walk reaches the core's held state
        assert {
            "scheduler.decisions.pending_sent",
            "scheduler.heartbeats.heard",
            "scheduler.node_controls.due",
        } <= set(sizes)  # ... and what the service's parts keep per job and per node
        assert sizes.pop("scheduler.ledger._ended") == ENDED_JOBS  # the last to end, however many did
        grown = {path: n for path, n in sizes.items() if n > SMALL and not path.startswith(PER_GPU_STATE)}
        assert grown == {}, "leader" if scheduler is leader else "follower"
    await store.close()
