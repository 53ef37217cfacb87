"""The node's job directories: deleted once the job is final and its retention has run out, never before."""

from __future__ import annotations

import time
from pathlib import Path

from gpuyard.services.executor.retention import JobDirSweeper
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobSucceeded
from gpuyard.shared.runtime.paths import replica_files

DAY = 86400.0


def job_dir(data_dir: Path, job_id: str) -> Path:
    return Path(replica_files(data_dir, job_id, 0, 0).job)


async def test_only_the_directories_of_jobs_final_for_longer_than_the_retention_are_deleted(h):
    ex = await h.executor()
    done = await h.submit(command=["true"])
    held, running = [await h.submit(command=["sleep", "30"]) for _ in range(2)]
    for job in (done, held, running):
        await h.place(ex, job)
    await h.wait(done, "succeeded")  # (its attempt is over here: this executor recorded its end)
    await h.wait(held, "running")
    await h.wait(running, "running")
    # another process ends `held` (a cancel recorded elsewhere); this executor has not heard of it yet
    await h.ledger.append(held, JobCancelled(job_id=held, attempt=1, by="test"))
    stray = job_dir(h.data_dir, "not-a-job-of-the-store")
    stray.mkdir(parents=True)
    dirs = {job: job_dir(h.data_dir, job) for job in (done, held, running)}
    assert all(d.is_dir() for d in dirs.values())

    sweeper = JobDirSweeper(h.data_dir, h.store, ex.attempts, keep_seconds=7 * DAY)
    assert await sweeper.sweep() == []  # ended just now: kept for its retention
    assert await sweeper.sweep(now=time.time() + 8 * DAY) == [done]
    assert not dirs[done].exists()
    assert dirs[held].is_dir()  # final in the store, but this executor still holds its attempt
    assert dirs[running].is_dir() and stray.is_dir()

    never = JobDirSweeper(h.data_dir, h.store, ex.attempts, keep_seconds=0)
    await h.deliver(ex, JobCancelled(job_id=held, attempt=1, by="test"))
    assert held not in {record.key.job_id for record in ex.attempts}
    assert await never.sweep(now=time.time() + 800 * DAY) == []  # retention `never`
    assert dirs[held].is_dir()


async def test_the_working_directories_under_the_job_root_go_with_the_job(h, tmp_path):
    ex = await h.executor()
    done = await h.submit(command=["true"])
    await h.place(ex, done)
    await h.wait(done, "succeeded")
    await h.deliver(ex, JobSucceeded(job_id=done, attempt=1))
    job_root = tmp_path / "job-root"
    work, other = job_root / done / "attempt-1" / "work-0", job_root / "another-job"
    work.mkdir(parents=True)
    other.mkdir()
    sweeper = JobDirSweeper(h.data_dir, h.store, ex.attempts, keep_seconds=7 * DAY, job_root=job_root)
    assert await sweeper.sweep(now=time.time() + 8 * DAY) == [done]
    assert not (job_root / done).exists() and other.is_dir()
