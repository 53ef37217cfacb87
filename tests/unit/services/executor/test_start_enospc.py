"""A replica that cannot start because the node's disk is full (ENOSPC: its folders, its log, its pid file) is
the platform's fault, not the job's: the attempt is requeued as a new one (as one whose processes were lost),
after the retry backoff, and the job does not fail, whatever retries it allows. Nothing of the attempt is left
running on the node, and once there is space again its next attempt runs. A start that fails otherwise still
fails the job with the reason."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
from datetime import UTC, datetime

import pytest

from gpuyard.services.executor import localstart
from gpuyard.services.executor.claims import Claims
from gpuyard.services.executor.logfile import RotatingLog
from gpuyard.services.executor.pidfiles import pid_file
from gpuyard.services.executor.reaper_client import ReaperClient, StartRefused
from gpuyard.shared.runtime.paths import log_path

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def replica_of(path) -> int:
    return int(re.search(r"replica-(\d+)\.", str(path)).group(1))


def full_disk_at(where: str, monkeypatch, replicas: set[int] | None = None) -> None:
    """Inject ENOSPC where a replica's start writes to the node's disk (for `replicas` only, else every one)."""

    def refused(replica: int) -> bool:
        return replicas is None or replica in replicas

    if where == "working dir":
        made = localstart.make_replica_dirs

        def dirs(files, *, work=True):
            if refused(replica_of(files.log)):
                raise NO_SPACE
            made(files, work=work)

        monkeypatch.setattr(localstart, "make_replica_dirs", dirs)
    elif where == "log":
        opened = RotatingLog._open

        def open_log(self):
            if refused(replica_of(self.path)):
                raise NO_SPACE
            return opened(self)

        monkeypatch.setattr(RotatingLog, "_open", open_log)
    elif where == "pid file":  # (the reaper writes it: its answer says which step failed)
        started = ReaperClient.start

        async def start(self, argv, **kw):
            if refused(replica_of(kw["pid_file"])):
                raise StartRefused(errno.ENOSPC, "pid_file", os.strerror(errno.ENOSPC))
            return await started(self, argv, **kw)

        monkeypatch.setattr(ReaperClient, "start", start)
    else:
        raise AssertionError(where)


@pytest.mark.parametrize("where", ["working dir", "log", "pid file"])
async def test_a_start_refused_by_a_full_disk_requeues_the_attempt_and_the_next_one_runs(
    h, monkeypatch, where
):
    ex = await h.executor()
    job = await h.submit(command="echo ran")  # (no retries allowed: a failure would be final)
    with monkeypatch.context() as disk:
        full_disk_at(where, disk)
        await h.place(ex, job)
        view = await h.wait(job, "queued")
    assert await h.types(job) == ["submitted", "placed", "requeued"]
    assert view.attempt == 2 and view.attempts[0].summary == "requeued: node_lost"
    assert (
        "node node-a could not start replica 0: no space left on the node's disk" in view.attempts[0].message
    )
    assert view.not_before is not None and view.not_before > datetime.now(UTC)  # the retry backoff
    if where == "pid file":
        assert view.attempts[0].message.endswith("no space left on the node's disk (its pid file)")
    assert (job, 1) not in ex.attempts

    await h.place(ex, job, attempt=2)  # space again
    view = await h.wait(job, "succeeded")
    assert view.attempt == 2 and log_path(h.data_dir, job, 2, 0).read_text() == "ran\n"


async def test_a_gang_whose_second_replica_finds_the_disk_full_stops_the_first_and_is_requeued(
    h, monkeypatch, tmp_path
):
    ex = await h.executor()
    job = await h.submit(command="sleep 60", replicas=2)
    with monkeypatch.context() as disk:
        full_disk_at("pid file", disk, replicas={1})
        await h.place(ex, job)
        view = await h.wait(job, "queued")
    assert view.attempt == 2 and "could not start replica 1" in view.attempts[0].message
    assert not pid_file(h.data_dir, job, 1, 0).exists()  # replica 0 was stopped and forgotten
    assert ex.backend.sessions((job, 1)) == {}


async def test_a_start_that_fails_for_another_reason_still_fails_the_job(h, monkeypatch):
    ex = await h.executor()
    job = await h.submit(command="echo never")

    def broken(files, *, work=True):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(localstart, "make_replica_dirs", broken)
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and "Input/output error" in view.message


async def test_an_attempt_whose_claim_finds_the_disk_full_is_requeued(h, monkeypatch):
    """With several executor processes on the node, the first to act on an attempt writes its claim: a full
    disk there is the node's fault too."""
    ex = await h.executor(executor_workers=2, executor_worker=0)
    job = await h.submit(command="echo ran")

    def full(self, key):
        raise NO_SPACE

    with monkeypatch.context() as disk:
        disk.setattr(Claims, "take", full)
        await h.place(ex, job)
        view = await h.wait(job, "queued")
    assert view.attempt == 2 and view.attempts[0].message.endswith(
        "no space left on the node's disk (its claim)"
    )
    await h.place(ex, job, attempt=2)
    assert (await h.wait(job, "succeeded")).attempt == 2


async def test_a_full_disk_met_after_the_process_started_leaves_nothing_behind(h, monkeypatch):
    """The last step of a start (its output's pump) meets ENOSPC after the replica's process began: it is
    killed, no descriptor is left open, and the attempt is requeued."""
    ex = await h.executor()
    job = await h.submit(command="sleep 30")
    before = len(os.listdir("/proc/self/fd"))
    real_start, started = ex.backend.reaper.start, []

    async def start(*args, **kwargs):
        started.append(await real_start(*args, **kwargs))
        return started[-1]

    def pump(*_args, **_kwargs):
        raise NO_SPACE

    monkeypatch.setattr(ex.backend.reaper, "start", start)
    monkeypatch.setattr(localstart, "LogPump", pump)
    await h.place(ex, job)
    view = await h.wait(job, "queued")
    assert view.attempt == 2 and "started" not in await h.types(job) and ex.backend.replicas == {}
    assert [await asyncio.wait_for(proc.wait(), 5) for proc in started] == [-signal.SIGKILL]
    assert len(os.listdir("/proc/self/fd")) == before
