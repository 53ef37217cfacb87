"""The scheduler believes the event store, not the bus: a job event the store does not hold (forged, or about
a job or attempt that does not exist) changes nothing, and a heartbeat no machine could send is ignored. None
of them stops the scheduler. What the bus failed to bring, the periodic resync repairs from the store (it
compares versions and re-reads only the jobs that differ)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.main import job_events, job_messages
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.bus.headers import ENTITY_HEADER, MSG_ID_HEADER, VERSION_HEADER
from gpuyard.shared.contracts.events.envelope import make_event, subject_of
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.ledger import JobLedger


def scheduler(store) -> SchedulerService:
    service = SimpleNamespace(
        ledger=JobLedger(store, None, "/scheduler"), store=store, bus=SimpleNamespace(js=None, replicas=1)
    )
    return SchedulerService(service, SchedulerSettings())


def submitted(job_id: str) -> JobSubmitted:
    spec = JobSpec(command="true", resources={"gpus": 1})
    return JobSubmitted(job_id=job_id, name=job_id, tenant="t", user="u", spec=spec)


@pytest.fixture(params=["decoded", "undecoded", "undecoded, without headers"])
def deliver(request):
    """Hand an event to the scheduler as its watch does (undecoded: it reads the job, id and kind from the
    message's headers and subject, and decodes a message without them), or decoded; with the version header a
    forger can set as easily as anyone."""

    async def deliver(s: SchedulerService, event, version: int) -> None:
        headers = {VERSION_HEADER: str(version)}
        if request.param != "undecoded, without headers":
            headers.update({MSG_ID_HEADER: event.id, ENTITY_HEADER: event.subject})
        msg = SimpleNamespace(headers=headers, subject=subject_of(event, "t"), data=event.to_json())
        handlers = SchedulerHandlers(s)
        table = job_events(handlers)
        if request.param == "decoded":
            await table(event, msg)
        else:
            await job_messages(table, handlers.job_changed)(None, msg)

    return deliver


async def test_a_forged_end_of_a_running_job_does_not_free_its_gpus(store, deliver):
    s = scheduler(store)
    executor = JobLedger(store, None, "/executor")
    await JobLedger(store, None, "/submit").append("j1", submitted("j1"))
    placement = [ReplicaPlacement(replica=0, node="n")]
    await s.ledger.append("j1", JobPlaced(job_id="j1", attempt=1, placements=placement))  # its own write
    started = await executor.append("j1", JobStarted(job_id="j1", attempt=1, node="n", replicas=[0]))
    await s.load()
    await deliver(s, started.event, 3)
    forged = make_event(JobSucceeded(job_id="j1", attempt=1), source="/forger")
    await deliver(s, forged, 4)  # the next version, as a real end would be
    await s.refresh_dirty()
    assert s.view.jobs["j1"].state == JobState.RUNNING
    assert [a.job.job_id for a in s.view.held.allocations()] == ["j1"]
    ended = await executor.append("j1", JobSucceeded(job_id="j1", attempt=1))  # the real end, at version 4
    await deliver(s, ended.event, 4)
    await s.refresh_dirty()
    assert "j1" not in s.view.jobs and not s.view.held.allocations()


async def test_a_forged_submission_or_placement_changes_no_queue(store, deliver):
    await JobLedger(store, None, "/submit").append("j1", submitted("j1"))
    s = scheduler(store)
    await s.load()
    ghost = make_event(submitted("ghost"), source="/forger")
    placed = make_event(
        JobPlaced(job_id="j1", attempt=1, placements=[ReplicaPlacement(replica=0, node="n")]),
        source="/forger",
    )
    await deliver(s, ghost, 1)
    await deliver(s, placed, 2)
    await s.refresh_dirty()
    assert set(s.view.jobs) == {"j1"} and s.view.jobs["j1"].state == JobState.QUEUED
    assert [r.job_id for r in s.view.queue()] == ["j1"] and not s.view.held.allocations()


async def test_what_the_scheduler_missed_is_repaired_and_nothing_else_is_read(store):
    submit = JobLedger(store, None, "/submit")
    for job_id in ("kept", "ends", "changes"):
        await submit.append(job_id, submitted(job_id))
    s = scheduler(store)
    await s.load()
    kept = s.view.jobs["kept"]
    # events the scheduler never hears of (another writer's ledger, no bus)
    await submit.append("new", submitted("new"))
    await submit.append("ends", JobCancelled(job_id="ends", attempt=1, by="u"))
    stale = s.view.jobs["changes"]
    await submit.append("changes", JobCancelled(job_id="changes", attempt=1, by="u"))
    s.view.put_job(stale)  # (still queued, at its old version)

    reads = []
    read_stream = store.read_stream
    store.read_stream = lambda job_id, **kw: reads.append(job_id) or read_stream(job_id, **kw)
    await s.recheck()

    assert set(s.view.jobs) == {"kept", "new"}
    assert s.view.jobs["new"].state == JobState.QUEUED
    assert s.view.jobs["kept"] is kept
    assert sorted(reads) == ["changes", "ends", "new"]
    assert [r.job_id for r in s.view.queue()] == ["kept", "new"]


def heartbeat(**changes) -> NodeHeartbeat:
    values = {
        "node": "n1",
        "gpus": [GpuInfo(index=i, uuid=f"GPU-{i}", model="SIM", memory_bytes=16 << 30) for i in range(2)],
        "cpus": 16,
        "memory_bytes": 64 << 30,
        **changes,
    }
    return NodeHeartbeat(**values)


def gpu(index: int, memory: int = 16 << 30) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", model="SIM", memory_bytes=memory)


ABSURD = {
    "two GPUs with one index": {"gpus": [gpu(0), gpu(0)]},
    "a negative GPU index": {"gpus": [gpu(-1)]},
    "a GPU of a petabyte": {"gpus": [gpu(0, 1 << 50)]},
    "a negative GPU memory": {"gpus": [gpu(0, -1)]},
    "a thousand GPUs": {"gpus": [gpu(i) for i in range(1000)]},
    "infinite cpus": {"cpus": float("inf")},
    "no number of cpus": {"cpus": float("nan")},
    "negative memory": {"memory_bytes": -1},
    "an empty node name": {"node": ""},
    "a name with spaces": {"node": "a b"},
    "no interval": {"interval_seconds": 0},
}


@pytest.mark.parametrize("changes", ABSURD.values(), ids=ABSURD.keys())
async def test_a_heartbeat_no_machine_could_send_is_ignored(changes):
    s = SchedulerService(
        SimpleNamespace(ledger=None, bus=SimpleNamespace(js=None, replicas=1)), SchedulerSettings()
    )
    handlers = SchedulerHandlers(s)
    forged = make_event(heartbeat(**changes), source="/forger")
    await handlers.on_heartbeat(forged.data, forged)
    assert not s.view.nodes and not s.wake.is_set()
    real = make_event(heartbeat(), source="/executor")
    await handlers.on_heartbeat(real.data, real)  # a real one still counts
    assert list(s.view.nodes) == ["n1"] and s.view.nodes["n1"].last_seen <= time.time()
