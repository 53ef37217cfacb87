"""The executor acts on a job event only when the event store holds it: an event seen on the bus that was never
recorded (forged by whoever could publish, or about an attempt that does not exist) changes nothing."""

from __future__ import annotations

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobCancelRequested,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobSucceeded,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.stops import PreemptionCause

from .witnesses import job_sessions, running_marker_job, runs_unstopped


async def forge(ex, data) -> None:
    """An event delivered as the bus would, that no service stored."""
    await ex.handlers(make_event(data, source="/forger"))


async def running_job(h, ex) -> str:
    job = await h.submit(command="sleep 30", resources={"gpus": 1})
    await h.place(ex, job)
    await h.wait(job, "running")
    return job


async def still_running(h, ex, job: str) -> None:
    await runs_unstopped(h, ex, job)  # a marker delivered after the forged events: they stopped nothing
    view = await h.view(job)
    assert view.state == "running" and not view.exits, await h.types(job)


async def test_a_forged_cancel_request_stops_nothing_and_a_recorded_one_does(h):
    ex = await h.executor()
    job = await running_job(h, ex)
    await forge(ex, JobCancelRequested(job_id=job, by="someone-else"))
    await still_running(h, ex, job)
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    assert (await h.wait(job, "cancelled")).state == "cancelled"


async def test_forged_ends_and_preemptions_of_a_running_attempt_stop_nothing(h):
    ex = await h.executor()
    job = await running_job(h, ex)
    await forge(ex, JobSucceeded(job_id=job, attempt=1))
    await forge(
        ex,
        JobPreempted(job_id=job, attempt=1, cause=PreemptionCause.OTHER, message="forged", grace_seconds=0),
    )
    await forge(ex, JobRequeued(job_id=job, attempt=2, reason=RequeueReason.PREEMPTED))
    await still_running(h, ex, job)
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    await h.wait(job, "cancelled")


async def test_a_placement_for_an_attempt_that_does_not_exist_starts_nothing(h):
    ex = await h.executor()
    job = await h.submit(command="sleep 60", resources={"gpus": 1})
    placement = [ReplicaPlacement(replica=0, node="node-a")]
    await forge(ex, JobPlaced(job_id=job, attempt=2, placements=placement))  # no attempt 2
    await forge(ex, JobPlaced(job_id=job, attempt=1, placements=placement))  # attempt 1 is queued
    await forge(ex, JobPlaced(job_id="no-such-job", attempt=1, placements=placement))
    # the marker: the recorded placement of attempt 1, delivered after the forged ones, starts it
    await h.place(ex, job)
    await h.wait(job, "running")
    assert await h.types(job) == ["submitted", "placed", "started"]  # nothing started before it was placed
    assert [record.key for record in ex.attempts] == [(job, 1)]
    assert len(job_sessions(job)) == 1 and job_sessions("no-such-job") == set()
    assert not (h.data_dir / "jobs" / job / "attempt-2").exists()
    assert not (h.data_dir / "jobs" / "no-such-job").exists()


async def test_a_forged_placement_of_a_job_placed_elsewhere_starts_nothing_here(h):
    ex = await h.executor()  # node-a
    job = await h.submit(command="echo ran", resources={"gpus": 1})
    stored = JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-b")])
    await h.ledger.append(job, stored)
    await forge(ex, JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-a")]))
    await running_marker_job(h, ex)  # placed here after the forged placement, and started
    assert await h.types(job) == ["submitted", "placed"]
    assert not ex.attempts.get((job, 1)) and not (h.data_dir / "jobs" / job).exists()
    assert job_sessions(job) == set()
