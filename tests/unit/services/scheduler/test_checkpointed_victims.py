"""The live scheduler follows `job.checkpointed`: a running job's latest checkpoint moves where the work a
preemption would lose begins, so the victim chosen is the job that loses the least, and `job.preempted` says
how much (`lost_work_seconds`), for a priority preemption and for a drain."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.main import job_events
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.services.scheduler.view import checkpointed_at
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobCheckpointed,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobStarted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.events.nodes import NodeAction, NodeControlChanged
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.readmodels import nodecontrol
from tests.unit.services.scheduler.onenode import leader, running_on, submit

GIB = 1 << 30


async def checkpoint(s: SchedulerService, job_id: str, attempt: int = 1) -> datetime:
    """What the API does for `gpuyard.checkpoint.save`: the event recorded, then published; the scheduler's
    watch hands it to its table of job events. When it was saved."""
    saved_at = datetime.now(UTC)
    data = JobCheckpointed(job_id=job_id, attempt=attempt, step=7, size_bytes=1024, saved_at=saved_at)
    outcome = await JobLedger(s.service.store, None, "/submit").append(job_id, data)
    await job_events(SchedulerHandlers(s))(outcome.event)
    return saved_at


async def preempt_for_a_critical_job(s: SchedulerService) -> tuple[float, float]:
    """A critical job that needs one of the two busy GPUs comes; a cycle runs. When it ran (before, after)."""
    await submit(s.service.store, "urgent", priority="critical")
    s.dirty.add("urgent")
    before = time.time()
    await s.cycle()
    return before, time.time()


async def preempted(s: SchedulerService) -> dict[str, JobPreempted]:
    """The preemptions the event store holds, by job."""
    views = [await s.ledger.load(job_id) for job_id in ("old", "young", "j")]
    return {v.job_id: v.preempt_requested for v in views if v is not None and v.preempt_requested is not None}


async def test_without_checkpoints_the_youngest_job_is_the_victim(store):
    await running_on(store, "old", gpu=0, priority="low")
    young_started = await running_on(store, "young", gpu=1, priority="low")
    s = await leader(store, min_runtime_before_preemption=0)
    before, after = await preempt_for_a_critical_job(s)
    found = await preempted(s)
    assert list(found) == ["young"]
    lost = found["young"].lost_work_seconds
    assert before - young_started.timestamp() <= lost <= after - young_started.timestamp()


async def test_a_checkpoint_reported_while_running_makes_the_older_job_the_victim(store):
    await running_on(store, "old", gpu=0, priority="low")
    await running_on(store, "young", gpu=1, priority="low")
    s = await leader(store, min_runtime_before_preemption=0)
    saved_at = await checkpoint(s, "old")
    before, after = await preempt_for_a_critical_job(s)
    found = await preempted(s)
    assert list(found) == ["old"]
    lost = found["old"].lost_work_seconds
    assert before - saved_at.timestamp() <= lost <= after - saved_at.timestamp()


async def test_a_drain_says_the_work_lost_since_the_checkpoint(store):
    await running_on(store, "j", gpu=1, priority="low")
    s = await leader(store, min_runtime_before_preemption=0)
    saved_at = await checkpoint(s, "j")
    event = make_event(
        NodeControlChanged(node="n", gpu=1, action=NodeAction.DRAIN, by="root"), source="/test"
    )
    await nodecontrol.record(store, event)
    await SchedulerHandlers(s).on_node_control(event.data, event)
    before = time.time()
    await s.cycle()
    lost = (await preempted(s))["j"].lost_work_seconds
    assert before - saved_at.timestamp() <= lost <= time.time() - saved_at.timestamp()


async def test_an_earlier_attempts_checkpoint_counts_from_the_current_attempts_start(store):
    await running_on(store, "j", gpu=0, priority="low")
    s = await leader(store, min_runtime_before_preemption=0)
    await checkpoint(s, "j")
    requeued = JobRequeued(job_id="j", attempt=2, reason=RequeueReason.NODE_LOST, message="lost")
    await JobLedger(store, None, "/scheduler").append("j", requeued)
    placement = ReplicaPlacement(replica=0, node="n", gpus=[GpuShare(index=0, uuid="GPU-0")])
    await JobLedger(store, None, "/scheduler").append(
        "j", JobPlaced(job_id="j", attempt=2, placements=[placement])
    )
    outcome = await JobLedger(store, None, "/executor").append(
        "j", JobStarted(job_id="j", attempt=2, node="n", replicas=[0])
    )
    view = outcome.view
    started = view.started_at.timestamp()
    assert view.checkpoint.attempt == 1 and checkpointed_at(view, started) == started
