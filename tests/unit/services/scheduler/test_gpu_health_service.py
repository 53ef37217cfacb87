"""The live scheduler and the node controls of the event store (`gpuyard.shared.stores.readmodels.nodecontrol`): a job on a GPU marked
unhealthy is requeued with `gpu_unhealthy` and placed again on the node's other GPU; a drain preempts the
jobs there; a cordon keeps new jobs off until the uncordon; a restarted scheduler knows all of it."""

from __future__ import annotations

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobSubmitted,
    RequeueReason,
)
from gpuyard.shared.contracts.events.nodes import (
    GpuHealthChanged,
    NodeAction,
    NodeControlChanged,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.contracts.stops import PreemptionCause
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.readmodels import nodecontrol
from tests.unit.services.scheduler.onenode import leader, running_on, submit

GIB = 1 << 30


async def say(s: SchedulerService, data) -> None:
    """What the API or the node's monitor does: record the event in the node's stream, publish it."""
    event = make_event(data, source="/test")
    await nodecontrol.record(s.service.store, event)
    await SchedulerHandlers(s).on_node_control(event.data, event)


def gpus_of(s: SchedulerService, job_id: str) -> list[int]:
    return [g.index for p in s.view.jobs[job_id].placements for g in p.gpus]


unhealthy = GpuHealthChanged(node="n", index=1, uuid="GPU-1", reason="xid", message="fatal XID 79", xid=79)


async def test_a_job_on_an_unhealthy_gpu_is_requeued_and_placed_on_the_other_gpu(store):
    await running_on(store, "j1", gpu=1)
    s = await leader(store)
    await say(s, unhealthy)
    await s.cycle()
    stored = await s.ledger.load("j1")
    requeued = [e.event.data for e in await store.read_stream("j1") if e.event.type.endswith("requeued")]
    assert [(r.reason, r.attempt) for r in requeued] == [(RequeueReason.GPU_UNHEALTHY, 2)]
    assert "GPU 1 of node n is unhealthy: fatal XID 79" in requeued[0].message
    assert stored.attempt == 2
    assert s.view.jobs["j1"].state == JobState.PLACED and gpus_of(s, "j1") == [0]
    await s.cycle()  # nothing more: requeued once
    assert len([e for e in await store.read_stream("j1") if e.event.type.endswith("requeued")]) == 1


async def test_the_unhealthy_gpu_stays_out_after_a_restart_and_a_job_that_needs_it_says_why(store):
    s = await leader(store)
    await say(s, unhealthy)
    await submit(store, "j1")
    await submit(store, "two")
    spec = JobSpec(command="true", resources={"gpus": 2})
    await JobLedger(store, None, "/submit").append(
        "big", JobSubmitted(job_id="big", name="big", tenant="t", user="u", spec=spec)
    )
    restarted = await leader(store)  # a new scheduler: the mark is read from the event store
    await restarted.cycle()
    placed = [j for j in ("j1", "two") if restarted.view.jobs[j].state == JobState.PLACED]
    assert len(placed) == 1 and gpus_of(restarted, placed[0]) == [0]
    big = (await restarted.ledger.load("big")).pending
    assert big is not None and big.code == "too_large" and "1 GPU unhealthy or cordoned" in big.message


async def test_cordon_keeps_new_jobs_off_running_ones_stay_and_uncordon_lets_them_in(store):
    await running_on(store, "old", gpu=0)
    s = await leader(store)
    await say(s, NodeControlChanged(node="n", action=NodeAction.CORDON, by="root"))
    await submit(store, "new")
    s.dirty.add("new")
    await s.cycle()
    assert s.view.jobs["new"].state == JobState.QUEUED
    assert s.view.jobs["old"].state == JobState.RUNNING and s.view.jobs["old"].preempt_requested is None
    await say(s, NodeControlChanged(node="n", action=NodeAction.UNCORDON, by="root"))
    await s.cycle()
    assert s.view.jobs["new"].state == JobState.PLACED and gpus_of(s, "new") == [1]


async def test_uncordon_clears_the_unhealthy_mark(store):
    s = await leader(store)
    await say(s, unhealthy)
    await say(s, NodeControlChanged(node="n", gpu=1, action=NodeAction.UNCORDON, by="root"))
    control = await nodecontrol.read(store, "n")
    assert control.unhealthy == {} and control.usable(1)
    for job_id in ("a", "b"):
        await submit(store, job_id)
        s.dirty.add(job_id)
    await s.cycle()
    assert sorted(gpus_of(s, "a") + gpus_of(s, "b")) == [0, 1]


async def test_a_drain_preempts_the_jobs_there_with_the_grace_period(store):
    await running_on(store, "j0", gpu=0)
    await running_on(store, "j1", gpu=1)
    s = await leader(store)
    await say(s, NodeControlChanged(node="n", gpu=1, action=NodeAction.DRAIN, by="root"))
    await s.cycle()
    assert s.view.jobs["j0"].preempt_requested is None
    preempted = s.view.jobs["j1"].preempt_requested
    assert preempted is not None and (preempted.cause, preempted.node) == (PreemptionCause.DRAIN, "n")
    assert preempted.grace_seconds == s.settings.preemption_grace


async def test_a_mark_the_bus_never_brought_is_read_at_the_next_resync(store):
    await running_on(store, "j1", gpu=1)
    s = await leader(store)
    await nodecontrol.record(store, make_event(unhealthy, source="/monitor"))  # recorded, never published
    await s.cycle()
    assert s.view.jobs["j1"].state == JobState.RUNNING
    await s.node_controls.load()  # what `resync` does every resync_interval
    await s.cycle()
    assert (await s.ledger.load("j1")).attempt == 2
