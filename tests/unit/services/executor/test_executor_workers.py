"""Several executor processes on one node: each attempt is run by one of them (its claim), whatever reaches
the others (a redelivered placement, a cancel every one of them sees, a restart's reconciliation)."""

from __future__ import annotations

import asyncio
import json
import os

from gpuyard.services.executor.claims import Claims
from gpuyard.services.executor.pidfiles import pid_file
from gpuyard.services.executor.processes import process_start_time
from gpuyard.shared.contracts.events.jobs import JobCancelRequested, JobPlaced, ReplicaPlacement

from .witnesses import job_sessions

TWO = {"executor_workers": 2}


def placement(job: str, attempt: int = 1) -> JobPlaced:
    return JobPlaced(
        job_id=job,
        attempt=attempt,
        placements=[ReplicaPlacement(replica=0, node="node-a", cpus=1, memory_bytes=1)],
    )


async def started_pid(h, job: str) -> int:
    await h.wait(job, "running")
    return json.loads(pid_file(h.data_dir, job, 1, 0).read_text())["pid"]


async def test_a_placement_redelivered_to_another_worker_starts_nothing(h, tmp_path):
    runs = tmp_path / "runs"
    first = await h.executor(**TWO, executor_worker=1)
    other = await h.executor(**TWO, executor_worker=0)
    job = await h.submit(command=f"echo run >> {runs}; sleep 60")
    placed = await h.place(first, job)
    pid = await started_pid(h, job)
    await h.deliver(other, placed)  # JetStream gives it to the other worker after an ack was lost
    assert Claims(h.data_dir, "node-a", 0, shared=True).holder((job, 1)) == 1
    assert (job, 1) not in other.attempts and (job, 1) in first.attempts
    # a start by `other` would be a second session of the job's, there once its delivery returned
    assert job_sessions(job) == {pid}
    await h.wait_for(lambda: runs.exists() and runs.read_text(), 5, "the start")
    assert runs.read_text() == "run\n" and (await h.types(job)).count("started") == 1


async def test_a_cancel_is_carried_out_by_the_worker_that_runs_the_job(h):
    runner = await h.executor(**TWO, executor_worker=0)
    bystander = await h.executor(**TWO, executor_worker=1)
    job = await h.submit(command="sleep 60")
    await h.place(runner, job)
    pid = await started_pid(h, job)
    cancel = JobCancelRequested(job_id=job, by="ana")
    await h.record(bystander, cancel)  # every worker sees it; this one does not run the job
    assert (job, 1) not in bystander.attempts and job_sessions(job) == {pid}
    await h.deliver(runner, cancel)
    view = await h.wait(job, "cancelled")
    # its replica's exit: stopped by the runner, which still ran it when the cancel reached it (a cancel the
    # bystander had carried out would have ended the attempt without one)
    assert view.message == "cancelled while running" and [e.replica for e in view.exits] == [0]
    assert (await h.types(job)).count("cancelled") == 1
    await h.wait_for(lambda: process_start_time(pid) is None, 5, "the replica to be stopped")


async def test_a_cancel_before_any_start_is_recorded_once_and_nothing_starts(h):
    workers = [await h.executor(**TWO, executor_worker=w) for w in (0, 1)]
    job = await h.submit(command="sleep 60")
    placed = placement(job)
    await h.ledger.append(job, placed)  # placed, not yet delivered to either worker
    await h.ledger.append(job, JobCancelRequested(job_id=job, by="ana"))
    cancel = JobCancelRequested(job_id=job, by="ana")
    await asyncio.gather(*(h.deliver(ex, cancel) for ex in workers))
    await asyncio.gather(*(h.deliver(ex, placed) for ex in workers))
    view = await h.wait(job, "cancelled")
    assert view.exits == [] and "started" not in await h.types(job)
    assert not any(ex.attempts for ex in workers)


async def test_workers_reconciling_at_once_start_a_placed_job_once(h, tmp_path):
    runs = tmp_path / "runs"
    job = await h.submit(command=f"echo run >> {runs}; sleep 60")
    await h.ledger.append(job, placement(job))  # placed while every executor process was down
    workers = [await h.executor(**TWO, executor_worker=w) for w in (0, 1)]
    await asyncio.gather(*(ex.reconcile() for ex in workers))
    pid = await started_pid(h, job)
    assert sum((job, 1) in ex.attempts for ex in workers) == 1
    assert job_sessions(job) == {pid}  # (a second start would be a session of its own, there by now)
    await h.wait_for(lambda: runs.exists() and runs.read_text(), 5, "the start")
    assert runs.read_text() == "run\n"


async def test_a_restarted_worker_leaves_the_other_workers_jobs_alone(h):
    runner = await h.executor(**TWO, executor_worker=1)
    job = await h.submit(command="sleep 60")
    await h.place(runner, job)
    pid = await started_pid(h, job)
    restarted = await h.executor(**TWO, executor_worker=0)  # worker 0 crashed and came back
    await restarted.reconcile()
    assert (job, 1) not in restarted.attempts and job_sessions(job) == {pid}
    # the witness: the job is still the runner's to stop, its replica still running when the cancel comes
    await h.record(runner, JobCancelRequested(job_id=job, by="ana"))
    view = await h.wait(job, "cancelled")
    assert view.message == "cancelled while running" and [e.replica for e in view.exits] == [0]
    assert view.attempt == 1 and "requeued" not in await h.types(job)


def test_claims(tmp_path):
    key = ("j1", 1)
    zero, one = (Claims(tmp_path, "node-a", w, shared=True) for w in (0, 1))
    assert zero.holder(key) is None and zero.owns(key) and not one.owns(key)  # unclaimed: worker 0's
    assert one.take(key) and one.take(key)  # its own claim, taken again after a restart
    assert not zero.take(key) and one.holder(key) == 1 and one.owns(key) and not zero.owns(key)
    assert os.listdir(os.path.dirname(one.path(key))) == ["executor-node-a.claim"]
    single = Claims(tmp_path, "node-b", 0, shared=False)
    assert single.take(("j2", 1)) and single.owns(("j2", 1)) and not (tmp_path / "jobs" / "j2").exists()


async def test_a_cancel_that_arrives_while_the_replicas_start_stops_them(h):
    """Placements and cancels come on different consumers, so a cancel may overtake a launch under way."""
    ex = await h.executor()
    release = asyncio.Event()
    real_launch = ex.backend.launch

    async def slow_launch(attempt):
        await release.wait()
        return await real_launch(attempt)

    ex.backend.launch = slow_launch
    job = await h.submit(command="sleep 60")
    launching = asyncio.create_task(h.place(ex, job))
    await h.wait_for(lambda: getattr(ex.attempts.get((job, 1)), "running", None), 5, "the launch to begin")
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    release.set()
    await launching
    view = await h.wait(job, "cancelled", within=5)  # not when `sleep 60` ends
    assert view.message == "cancelled while running"
