"""The Slurm backend's bookkeeping against a fake of Slurm's commands (the real ones: tests/integration/slurm):
a launch submits each replica once, ends are read from the queue or the exit file, a batch job gone without
either is lost, a stop signals then cancels, an attempt Slurm never saw is not adopted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuyard.services.executor.backend import AttemptLaunch
from gpuyard.services.executor.exits import AttemptKey
from gpuyard.services.executor.slurm import backend as slurm_backend
from gpuyard.services.executor.slurm import batch
from gpuyard.services.executor.slurm.backend import SlurmBackend
from gpuyard.services.executor.slurm.cluster import SlurmNode
from gpuyard.services.executor.slurm.queue import SlurmJob, job_name
from gpuyard.shared.contracts.events.jobs import FailureReason, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.settings.slurm import SlurmConfig


class FakeSlurm:
    """What the backend's `commands` module would get from Slurm: a queue of jobs it submits and cancels."""

    def __init__(self):
        self.jobs: dict[str, SlurmJob] = {}
        self.submitted: list[tuple[list[str], str]] = []
        self.cancelled: list[tuple[list[str], str | None]] = []
        self.ends_on_term = True

    async def jobs_(self) -> list[SlurmJob]:
        return list(self.jobs.values())

    async def nodes(self, partition: str = "") -> dict[str, SlurmNode]:
        return {"n1": SlurmNode("n1", "10.0.0.1", "gpu:4,shard:16", "idle", ["gpu"], 32, 16000)}

    async def sbatch(self, args, script, env) -> str:
        slurm_id = str(100 + len(self.submitted))
        name = next(a.split("=", 1)[1] for a in args if a.startswith("--job-name="))
        self.submitted.append((list(args), script))
        self.jobs[slurm_id] = SlurmJob(
            slurm_id, name, "PENDING", 0, "None", "", "", "root", "gpuyard tenant=t"
        )
        return slurm_id

    async def scancel(self, ids, signal=None) -> None:
        self.cancelled.append((list(ids), signal))
        for slurm_id in ids:
            job = self.jobs[slurm_id]
            if signal is None or self.ends_on_term:
                self.jobs[slurm_id] = SlurmJob(
                    slurm_id, job.name, "CANCELLED", 15, "None", "n1", "", "root", ""
                )

    def set(self, name: str, state: str, status: int = 0) -> None:
        for slurm_id, job in self.jobs.items():
            if job.name == name:
                self.jobs[slurm_id] = SlurmJob(
                    slurm_id, name, state, status, "None", "n1", "", "root", job.comment
                )


class Recorder:
    def __init__(self):
        self.started: list[tuple] = []
        self.ended: list = []

    async def replicas_started(self, key, node, replicas) -> None:
        self.started.append((key, node, tuple(replicas)))

    async def replica_ended(self, ended) -> None:
        self.ended.append(ended)


@pytest.fixture
async def slurm(monkeypatch, tmp_path):
    fake = FakeSlurm()
    for name, value in (
        ("jobs", fake.jobs_),
        ("nodes", fake.nodes),
        ("sbatch", fake.sbatch),
        ("scancel", fake.scancel),
    ):
        monkeypatch.setattr(slurm_backend.commands, name, value)
    monkeypatch.setattr(slurm_backend, "STOP_POLL", 0.01)
    backend = SlurmBackend(SlurmConfig(poll_interval=3600, exit_check_interval=3600), data_dir=tmp_path)
    events = Recorder()
    await backend.open(events)
    yield fake, backend, events
    await backend.close(0)


def launch(replicas: int = 2) -> AttemptLaunch:
    spec = JobSpec(name="x", command="true", replicas=replicas, resources={"gpus": 1})
    placements = [ReplicaPlacement(replica=r, node="n1", gpus=[{"index": r}]) for r in range(replicas)]
    return AttemptLaunch("j1", "x", "t", 1, spec, placements, list(range(replicas)), "127.0.0.1", 29500)


async def test_a_launch_submits_each_replica_once_and_reports_starts_and_ends(slurm):
    fake, backend, events = slurm
    assert await backend.launch(launch()) is None
    await backend.poll_once()
    assert len(fake.submitted) == 2 and events.started == []
    assert await backend.launch(launch()) is None  # (a redelivered placement: nothing submitted twice)
    assert len(fake.submitted) == 2
    fake.set(job_name("j1", 1, 0), "RUNNING")
    fake.set(job_name("j1", 1, 1), "FAILED", 3 << 8)
    await backend.poll_once()
    assert {s[2] for s in events.started} == {(0,), (1,)}
    [ended] = events.ended
    assert (ended.replica, ended.exit_code, ended.reason) == (1, 3, FailureReason.EXIT_CODE)
    Path(batch.spool_files(backend.spool, "j1", 1, 0).exit).write_text("0\n")
    await backend.check_exit_files()  # (its end shows in its exit file before the queue says it)
    assert [(e.replica, e.exit_code, e.reason) for e in events.ended][1] == (0, 0, None)
    assert backend.live == {}


async def test_a_batch_job_gone_without_an_exit_file_is_lost(slurm):
    fake, backend, events = slurm
    await backend.launch(launch(1))
    await backend.poll_once()
    fake.jobs.clear()  # (slurmctld forgot it: MinJobAge passed, or its state was lost)
    await backend.poll_once()
    [ended] = events.ended
    assert ended.reason == FailureReason.NODE_LOST and "no longer lists" in ended.message


async def test_a_stop_signals_then_cancels_what_outlives_the_grace(slurm):
    fake, backend, events = slurm
    await backend.launch(launch(1))
    await backend.poll_once()
    fake.set(job_name("j1", 1, 0), "RUNNING")
    fake.ends_on_term = False
    await backend.stop(AttemptKey("j1", 1), grace=0.05)
    assert fake.cancelled == [(["100"], "TERM"), (["100"], None)]
    [ended] = events.ended
    assert ended.signal == 9 and ended.reason == FailureReason.SIGNAL


async def test_a_stop_while_the_batch_jobs_are_submitted_cancels_them_once_submitted(slurm, monkeypatch):
    """A cancel that reaches the backend while `sbatch` runs finds no batch job to stop yet: the launch cancels
    what it submitted once `sbatch` answers, so that nothing of the attempt runs later, unseen."""
    fake, backend, events = slurm
    answer, submitting = asyncio.Event(), asyncio.Event()
    plain_sbatch = fake.sbatch

    async def slow_sbatch(args, script, env) -> str:
        submitting.set()
        await answer.wait()
        return await plain_sbatch(args, script, env)

    monkeypatch.setattr(slurm_backend.commands, "sbatch", slow_sbatch)
    launching = asyncio.create_task(backend.launch(launch(1)))
    await submitting.wait()
    await backend.stop(AttemptKey("j1", 1), grace=0.05)
    answer.set()
    assert await launching is None
    assert fake.cancelled[-1] == (["100"], None) and fake.jobs["100"].state == "CANCELLED"
    assert [e.replica for e in events.ended] == [0]


async def test_an_attempt_slurm_never_saw_is_not_adopted(slurm):
    fake, backend, events = slurm
    assert not await backend.adopt(AttemptKey("j9", 1), {0: "n1"})
    assert not backend.started_before(AttemptKey("j9", 1))
    await backend.launch(launch(1))
    assert backend.started_before(AttemptKey("j1", 1))
    assert await backend.adopt(AttemptKey("j1", 1), {0: "n1"})


def write_exit(backend: SlurmBackend, replica: int, code: int = 0) -> None:
    """As the batch script does: the exit code to `<file>.part`, then renamed."""
    exit_file = Path(batch.spool_files(backend.spool, "j1", 1, replica).exit)
    exit_file.with_name(exit_file.name + ".part").write_text(f"{code}\n")
    exit_file.with_name(exit_file.name + ".part").rename(exit_file)


async def test_an_exit_file_written_wakes_the_look_at_once(slurm):
    """inotify on the attempt's spool folder: its end is reported though the next look is an hour away."""
    fake, backend, events = slurm
    if backend.exit_files.fd < 0:
        pytest.skip("no inotify here")
    await backend.launch(launch(1))
    await backend.check_exit_files()  # (the look the exit loop began with, done: the next is an hour away)
    write_exit(backend, 0)
    await wait_until(lambda: events.ended)
    assert [(e.replica, e.exit_code, e.reason) for e in events.ended] == [(0, 0, None)]
    assert [s[2] for s in events.started] == [(0,)]


async def test_a_look_at_the_exit_files_does_not_wait_for_the_reports_of_the_one_before(slurm, monkeypatch):
    """A replica's end still being written to the event store does not hold up the next end seen (the exit loop,
    woken by inotify, looks again meanwhile), and is reported once, though that look sees its exit file again."""
    fake, backend, events = slurm
    if backend.exit_files.fd < 0:
        pytest.skip("no inotify here")
    await backend.launch(launch(2))
    release, first = asyncio.Event(), asyncio.Event()
    plain_ended = events.replica_ended

    async def slow_for_replica_0(ended) -> None:
        if ended.replica == 0:
            first.set()
            await release.wait()
        await plain_ended(ended)

    monkeypatch.setattr(events, "replica_ended", slow_for_replica_0)
    write_exit(backend, 0)
    await first.wait()
    write_exit(backend, 1, code=3)
    await wait_until(lambda: events.ended)
    assert [(e.replica, e.exit_code) for e in events.ended] == [(1, 3)]
    release.set()
    await wait_until(lambda: len(events.ended) == 2)
    await backend.check_exit_files()  # (a look after both: nothing left to report)
    assert sorted((e.replica, e.exit_code) for e in events.ended) == [(0, 0), (1, 3)]
    assert backend.live == {} and backend.reporting == set()


async def wait_until(condition) -> None:
    """Until `condition()` holds (a positive witness; the bound only ends a test that failed)."""
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (the recorder's lists: nothing to wait on)
            await asyncio.sleep(0.01)
