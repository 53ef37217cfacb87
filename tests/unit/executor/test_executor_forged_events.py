"""The executor acts on a job event only when the event store holds it: an event seen on the bus that was never
recorded (forged by whoever could publish, or about an attempt that does not exist) changes nothing."""

from __future__ import annotations

import asyncio

from shared.events import (
    JobCancelRequested,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobSucceeded,
    ReplicaPlacement,
    RequeueReason,
    make_event,
)


async def forge(ex, data) -> None:
    """An event delivered as the bus would, that no service stored."""
    await ex.on_event(make_event(data, source="/forger"), None)


async def running_job(h, ex) -> str:
    job = await h.submit(command="sleep 30", resources={"gpus": 1})
    await h.place(ex, job)
    await h.wait(job, "running")
    return job


async def still_running(h, job: str) -> None:
    await asyncio.sleep(0.5)  # what a forged event would have stopped is stopped by then
    view = await h.view(job)
    assert view.state == "running" and not view.exits, await h.types(job)


async def test_a_forged_cancel_request_stops_nothing_and_a_recorded_one_does(h):
    ex = await h.executor()
    job = await running_job(h, ex)
    await forge(ex, JobCancelRequested(job_id=job, by="someone-else"))
    await still_running(h, job)
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    assert (await h.wait(job, "cancelled")).state == "cancelled"


async def test_forged_ends_and_preemptions_of_a_running_attempt_stop_nothing(h):
    ex = await h.executor()
    job = await running_job(h, ex)
    await forge(ex, JobSucceeded(job_id=job, attempt=1))
    await forge(ex, JobPreempted(job_id=job, attempt=1, reason="forged", grace_seconds=0))
    await forge(ex, JobRequeued(job_id=job, attempt=2, reason=RequeueReason.PREEMPTED))
    await still_running(h, job)
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    await h.wait(job, "cancelled")


async def test_a_placement_for_an_attempt_that_does_not_exist_starts_nothing(h):
    ex = await h.executor()
    job = await h.submit(command="echo ran", resources={"gpus": 1})
    placement = [ReplicaPlacement(replica=0, node="node-a")]
    await forge(ex, JobPlaced(job_id=job, attempt=2, placements=placement))  # no attempt 2
    await forge(ex, JobPlaced(job_id=job, attempt=1, placements=placement))  # attempt 1 is queued
    await forge(ex, JobPlaced(job_id="no-such-job", attempt=1, placements=placement))
    await asyncio.sleep(0.3)
    assert await h.types(job) == ["submitted"]
    assert (await h.view(job)).state == "queued"
    assert not ex.attempts.get((job, 1)) and not (h.data_dir / "jobs" / job).exists()


async def test_a_forged_placement_of_a_job_placed_elsewhere_starts_nothing_here(h):
    ex = await h.executor()  # node-a
    job = await h.submit(command="echo ran", resources={"gpus": 1})
    stored = JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-b")])
    await h.ledger.append(job, stored)
    await forge(ex, JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-a")]))
    await asyncio.sleep(0.3)
    assert await h.types(job) == ["submitted", "placed"]
    assert not ex.attempts.get((job, 1)) and not (h.data_dir / "jobs" / job).exists()
