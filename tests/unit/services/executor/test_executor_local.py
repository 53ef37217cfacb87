"""The executor's lifecycle with the local backend: real processes, a real event store, no NATS."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import time

import pytest

from gpuyard.services.executor import localstart
from gpuyard.services.executor.pidfiles import pid_file
from gpuyard.services.executor.processes import process_start_time
from gpuyard.shared.contracts.events.jobs import (
    JobCancelRequested,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobStarted,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.stops import PreemptionCause, preemption_text
from gpuyard.shared.runtime.paths import log_files, log_path, replica_files

from .witnesses import job_sessions, running_marker_job, runs_unstopped


async def test_a_replica_runs_in_its_own_dir_with_its_env_and_its_output_is_logged(h):
    ex = await h.executor()
    job = await h.submit(command="echo rank=$RANK gpus=$CUDA_VISIBLE_DEVICES; pwd", resources={"gpus": 1})
    await h.place(ex, job)
    view = await h.wait(job, "succeeded")
    assert view.exit_code == 0
    assert await h.types(job) == ["submitted", "placed", "started", "replica_exited", "succeeded"]
    text = log_path(h.data_dir, job, 1, 0).read_text()
    assert "rank=0" in text and f"jobs/{job}/attempt-1/work-0" in text
    assert not pid_file(h.data_dir, job, 1, 0).exists()  # cleaned up once the replica ended


async def test_a_failure_keeps_exit_code_and_last_lines(h):
    ex = await h.executor()
    job = await h.submit(command="echo about to fail; exit 3")
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.exit_code == 3 and view.failure_reason == "exit_code"
    assert view.message == "replica 0: exited with code 3" and "about to fail" in view.log_tail


UNSTARTABLE = [  # (program, failure reason, words of the message)
    ("/no/such/program", "command_not_found", "command not found: /no/such/program"),
    ("no-such-program-xyz", "command_not_found", "no-such-program-xyz (not in the PATH)"),
    ("/tmp", "start_failed", "permission denied: /tmp is not executable"),
]


@pytest.mark.parametrize(("program", "reason", "words"), UNSTARTABLE)
async def test_a_command_that_cannot_start_fails_with_the_reason(h, program, reason, words):
    ex = await h.executor()
    job = await h.submit(command=[program])
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == reason and words in view.message
    assert "started" not in await h.types(job)


async def test_a_missing_working_dir_is_a_start_failure(h, tmp_path):
    ex = await h.executor()
    job = await h.submit(command="true", working_dir=str(tmp_path / "nope"))
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and "does not exist" in view.message


async def test_timeout_stops_the_job_and_says_so(h):
    ex = await h.executor()
    job = await h.submit(command="sleep 600", timeout=0.5)  # it never ends within the test by itself
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "timeout" and "timed out after 0.5s" in view.message
    exits = [e.data for e in await h.ledger.events(job) if e.type.endswith("replica_exited")]
    assert [e.signal for e in exits] == [signal.SIGTERM]  # the executor's stop ended it


async def test_cancel_sigterms_the_whole_process_group(h, tmp_path):
    ex = await h.executor()
    child = tmp_path / "child.pid"
    job = await h.submit(command=f"sleep 60 & echo $! > {child}; wait")
    await h.place(ex, job)
    await h.wait(job, "running")
    await h.wait_for(lambda: child.exists() and child.read_text().strip(), what="the child's pid")
    grandchild = int(child.read_text())
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    view = await h.wait(job, "cancelled")
    assert view.message == "cancelled while running"
    await h.wait_for(lambda: process_start_time(grandchild) is None, 5, "the background child to be gone")


async def test_preemption_sigterms_the_job_and_gives_it_the_grace_to_checkpoint(h, tmp_path):
    ex = await h.executor()
    term, go, trapped = tmp_path / "term", tmp_path / "go", tmp_path / "trap-set"
    checkpoint = f"touch {term}; while [ ! -e {go} ]; do sleep 0.05; done; echo checkpointed; exit 0"
    job = await h.submit(command=f"trap '{checkpoint}' TERM; touch {trapped}; while true; do sleep 0.1; done")
    await h.place(ex, job)
    await h.wait(job, "running")
    await h.wait_for(trapped.exists, 10, "the shell to install its trap")
    preempted = JobPreempted(job_id=job, attempt=1, cause=PreemptionCause.DRAIN, node="n1", grace_seconds=60)
    preempting = asyncio.create_task(h.record(ex, preempted))
    await h.wait_for(term.exists, 10, "SIGTERM to reach the job")
    go.touch()  # its checkpoint takes until now: the executor waits for it (the grace is 60 s)
    view = await h.wait(job, "queued")
    await preempting
    exits = [e.data for e in await h.ledger.events(job) if e.type.endswith("replica_exited")]
    assert [(e.exit_code, e.signal) for e in exits] == [(0, None)]  # its own end, no SIGKILL
    assert "checkpointed" in log_path(h.data_dir, job, 1, 0).read_text()
    assert (
        view.attempt == 2 and view.attempts[0].summary == "preempted: drain" and view.attempts[0].node == "n1"
    )
    assert view.message == "drain: node n1 is being drained"


async def test_preemption_sigkills_a_job_that_ignores_sigterm_after_the_grace(h, tmp_path):
    ex = await h.executor()
    trapped = tmp_path / "trap-set"
    job = await h.submit(command=f"trap '' TERM; touch {trapped}; while true; do sleep 0.1; done")
    await h.place(ex, job)
    await h.wait(job, "running")
    await h.wait_for(trapped.exists, 10, "the shell to ignore SIGTERM")
    preempted = JobPreempted(
        job_id=job, attempt=1, cause=PreemptionCause.PRIORITY, by_job="critical", grace_seconds=0.5
    )
    preempting = asyncio.create_task(h.record(ex, preempted))  # (it returns once the replica has ended)
    view = await h.wait(job, "queued")
    await preempting
    exits = [e.data for e in await h.ledger.events(job) if e.type.endswith("replica_exited")]
    assert [e.signal for e in exits] == [signal.SIGKILL]  # nothing else could end it
    assert view.attempt == 2 and view.attempts[0].summary == "preempted: priority"
    assert view.message == preemption_text(PreemptionCause.PRIORITY)


async def test_retry_requeues_with_backoff_then_fails(h):
    ex = await h.executor()
    job = await h.submit(command="exit 4", max_retries=1)
    await h.place(ex, job)
    view = await h.wait(job, "queued")
    assert view.attempt == 2 and view.not_before is not None
    assert "retry 1/1 after: exited with code 4" in view.message
    await h.place(ex, job, attempt=2)
    view = await h.wait(job, "failed")
    assert [a.summary for a in view.attempts] == ["requeued: retry", "failed: exit_code"]
    assert (await h.types(job)).count("started") == 2


def waits_for(go) -> str:
    """A command that runs until `go` appears, and takes it away as it ends: started a second time, while the
    first start runs or once it has ended, it would run on as a session of its own (`job_sessions`)."""
    return f"while [ ! -e {go} ]; do sleep 0.05; done; rm {go}"


async def test_a_redelivered_placement_starts_nothing_twice(h, tmp_path):
    ex = await h.executor()
    go = tmp_path / "go"
    job = await h.submit(command=waits_for(go))
    placed = await h.place(ex, job)
    await h.wait(job, "running")
    first = job_sessions(job)
    assert len(first) == 1
    await h.deliver(ex, placed)  # redelivered while its replica runs
    await runs_unstopped(h, ex, job)  # a marker delivered after it: the first start runs on, unstopped
    await running_marker_job(h, ex)  # and a placement after it starts: a second start would be there by now
    assert job_sessions(job) == first
    go.touch()
    await h.wait(job, "succeeded")
    await h.deliver(ex, placed)  # redelivered once the attempt is over
    await running_marker_job(h, ex)
    assert job_sessions(job) == set()  # (a second start would wait for `go`, taken away by the first)
    assert (await h.types(job)).count("started") == 1


async def test_a_gang_fails_as_one_when_a_replica_fails(h):
    ex = await h.executor()
    job = await h.submit(command='if [ "$RANK" = 1 ]; then exit 2; fi; sleep 30', replicas=2)
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.message == "replica 1: exited with code 2"
    await h.wait_for(
        lambda: not getattr(ex.attempts.get((job, 1)), "running", None), 5, "the other replica to be stopped"
    )


async def test_logs_are_capped_and_rotated(h):
    ex = await h.executor(log_max_bytes=2000, log_backups=2)
    job = await h.submit(command="for i in $(seq 1 1000); do echo line-$i; done")
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    files = log_files(log_path(h.data_dir, job, 1, 0))
    assert [f.name for f in files] == ["replica-0.log.2", "replica-0.log.1", "replica-0.log"]
    assert all(f.stat().st_size <= 2000 for f in files)
    text = "".join(f.read_text() for f in files)
    assert text.endswith("line-1000\n") and "line-1\n" not in text  # the oldest output was dropped
    numbers = [int(line.removeprefix("line-")) for line in text.split()]
    assert numbers == list(range(numbers[0], 1001))  # nothing lost or repeated inside what is kept


def crash(ex) -> None:
    """The executor dies without stopping anything (its reaper goes on): forget its replicas as a crash would."""
    ex.backend.replicas.clear()
    for task in list(ex.backend.watchers):
        task.cancel()
    ex.backend.reaper.close()
    ex.attempts._held.clear()


async def test_a_restarted_executor_adopts_what_still_runs_and_reports_its_real_end(h, tmp_path):
    ex = await h.executor()
    go = tmp_path / "go"
    job = await h.submit(command=f"while [ ! -e {go} ]; do sleep 0.05; done; echo done; exit 3")
    await h.place(ex, job)
    await h.wait(job, "running")
    record = json.loads(pid_file(h.data_dir, job, 1, 0).read_text())
    crash(ex)
    assert process_start_time(record["pid"]) == record["start"]

    again = await h.executor()
    await again.reconcile()
    assert (await h.view(job)).state == "running" and again.backend.sessions((job, 1)) == {0: record["pid"]}
    go.touch()
    view = await h.wait(job, "failed")
    assert view.attempt == 1 and view.exit_code == 3 and view.message == "replica 0: exited with code 3"
    assert log_path(h.data_dir, job, 1, 0).read_text() == "done\n"


async def test_a_replica_that_ended_while_no_executor_ran_is_reported_with_its_status(h, tmp_path):
    ex = await h.executor()
    go = tmp_path / "go"
    job = await h.submit(command=f"while [ ! -e {go} ]; do sleep 0.05; done; echo bye")
    await h.place(ex, job)
    await h.wait(job, "running")
    crash(ex)
    go.touch()
    exit_file = replica_files(h.data_dir, job, 1, 0).exit
    await h.wait_for(lambda: os.path.exists(exit_file), 5, "the reaper's exit file")

    again = await h.executor()
    await again.reconcile()
    assert (await h.wait(job, "succeeded")).attempt == 1
    assert log_path(h.data_dir, job, 1, 0).read_text() == "bye\n"  # kept by the reaper


async def test_a_replica_whose_reaper_is_gone_is_stopped_and_its_attempt_recorded_lost(h, tmp_path):
    ex = await h.executor()
    job = await h.submit(command="sleep 60")
    await h.place(ex, job)
    await h.wait(job, "running")
    record = json.loads(pid_file(h.data_dir, job, 1, 0).read_text())
    crash(ex)
    os.kill(record["reaper"], signal.SIGKILL)  # its status could never be known
    await h.wait_for(lambda: process_start_time(record["reaper"]) is None, 5, "the reaper's end")

    again = await h.executor()
    await again.reconcile()
    view = await h.wait(job, "queued")
    assert view.attempt == 2 and view.attempts[0].summary == "requeued: node_lost"
    await h.wait_for(lambda: process_start_time(record["pid"]) is None, 5, "the orphan to be stopped")


async def test_a_placement_an_earlier_executor_started_is_not_started_again(h, tmp_path):
    runs = tmp_path / "runs"
    job = await h.submit(command=f"echo run >> {runs}; sleep 60")
    placed = JobPlaced(
        job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-a", cpus=1, memory_bytes=1)]
    )
    await h.ledger.append(job, placed)
    # an executor started the replica, wrote its pid file and died before recording job.started
    orphan = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", f"echo run >> {runs}; sleep 60", start_new_session=True
    )
    path = pid_file(h.data_dir, job, 1, 0)
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {"pid": orphan.pid, "start": process_start_time(orphan.pid), "node": "node-a", "cgroup": None}
        )
    )
    await h.wait_for(lambda: runs.exists(), 5, "the first start")

    ex = await h.executor()
    await ex.reconcile()
    await h.deliver(ex, placed)  # and a redelivered placement changes nothing
    view = await h.wait(job, "queued")
    assert view.attempts[0].summary == "requeued: node_lost"
    assert await asyncio.wait_for(orphan.wait(), 5) == -signal.SIGTERM
    assert runs.read_text() == "run\n" and "started" not in await h.types(job)
    assert not path.exists()


async def test_distributed_env_is_torchrun_style(h):
    ex = await h.executor()
    job = await h.submit(
        command="echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT", replicas=2
    )
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    lines = [log_path(h.data_dir, job, 1, r).read_text().split() for r in (0, 1)]
    assert lines[0][:5] == ["0", "2", "0", "2", "127.0.0.1"] and lines[1][:5] == [
        "1",
        "2",
        "1",
        "2",
        "127.0.0.1",
    ]
    assert lines[0][5] == lines[1][5] and int(lines[0][5]) > 0


async def test_a_gang_replica_starts_even_when_another_nodes_replica_started_first(h, tmp_path):
    ex = await h.executor()  # node-a
    ex.nodes.addresses["node-b"] = "10.0.0.7"  # the master's address, from node-b's heartbeats
    go = tmp_path / "go"
    job = await h.submit(command=waits_for(go), replicas=2)
    view = await h.view(job)
    placed = JobPlaced(
        job_id=job,
        attempt=1,
        placements=[ReplicaPlacement(replica=r, node=n) for r, n in ((0, "node-b"), (1, "node-a"))],
    )
    await h.ledger.append(job, placed)
    # node-b's executor was quicker: its replica started and even ended before node-a hears of the placement
    await h.ledger.append(job, JobStarted(job_id=job, attempt=1, node="node-b", replicas=[0]))
    await h.ledger.append(job, JobReplicaExited(job_id=job, attempt=1, node="node-b", replica=0, exit_code=0))
    assert (await h.view(job)).state.value == "running" and view.version == 1
    await h.deliver(ex, placed)
    assert (await h.view(job)).current.started == [0, 1] and len(job_sessions(job)) == 1
    go.touch()
    done = await h.wait(job, "succeeded")
    assert done.current.started == [0, 1] and sorted(e.replica for e in done.exits) == [0, 1]
    await h.deliver(ex, placed)  # redelivered: this node's replica is not started again
    await running_marker_job(h, ex)  # placed after it, and started: a second start would be there by now
    assert job_sessions(job) == set()  # (a second start would wait for `go`, taken away by the first)
    assert (await h.types(job)).count("started") == 2


async def test_a_job_across_nodes_gets_the_master_nodes_address(h):
    ex = await h.executor()
    ex.nodes.addresses["node-b"] = "10.0.0.7"
    job = await h.submit(command="echo $MASTER_ADDR:$MASTER_PORT $RANK $LOCAL_RANK", replicas=2)
    await h.place(ex, job, nodes=["node-b", "node-a"])
    await h.wait_for(lambda: log_path(h.data_dir, job, 1, 1).exists(), 5, "replica 1's log")
    await h.wait_for(lambda: log_path(h.data_dir, job, 1, 1).read_text(), 5, "replica 1's output")
    address, rank, local = log_path(h.data_dir, job, 1, 1).read_text().split()
    assert address.startswith("10.0.0.7:") and 29500 <= int(address.split(":")[1]) < 31500
    assert (rank, local) == ("1", "0")
    assert not log_path(h.data_dir, job, 1, 0).exists()  # replica 0 is node-b's


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fails(error: Exception):
    def raises(*_args, **_kwargs):
        raise error

    return raises


UNSTARTABLE_BY_THE_NODE = [  # (what fails, its error, words of the message): none of them a spec's fault
    # (a full disk is not among them: its attempt is requeued, test_start_enospc.py)
    ("start", ValueError("embedded null byte"), "cannot start: embedded null byte"),
    ("start", OSError(errno.EMFILE, "Too many open files"), "Too many open files"),
    ("LogPump", OSError(errno.EBADF, "Bad file descriptor"), "Bad file descriptor"),
    ("replica_env", RuntimeError("surprise"), "cannot start: surprise"),
]


@pytest.mark.parametrize(("where", "error", "words"), UNSTARTABLE_BY_THE_NODE)
async def test_a_replica_that_cannot_be_started_fails_the_job_and_leaks_nothing(
    h, monkeypatch, where, error, words
):
    ex = await h.executor()
    job = await h.submit(command="sleep 30")
    before = open_fds()
    real_start = ex.backend.reaper.start
    started = []

    async def start(*args, **kwargs):
        started.append(await real_start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(ex.backend.reaper, "start", start)
    if where == "start":  # the reaper refuses it, or cannot be asked
        monkeypatch.setattr(ex.backend.reaper, "start", fails(error))
    else:
        monkeypatch.setattr(localstart, where, fails(error))
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and words in view.message
    assert "started" not in await h.types(job) and ex.backend.replicas == {}
    for proc in started:  # a process started before the failure was killed (and its pidfd closed once reaped)
        assert await asyncio.wait_for(proc.wait(), 5) == -signal.SIGKILL
    assert open_fds() == before  # neither end of the output pipe nor the log file left open


def processes_with(marker: bytes) -> list[int]:
    """Live processes whose command line holds `marker` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read() and process_start_time(int(entry)) is not None:
                        found.append(int(entry))
            except OSError:
                pass
    return found


async def test_nothing_of_a_job_outlives_it_without_cgroups_not_even_a_new_session(h, tmp_path):
    """A process that left the job's process group and session (setsid) is still the job's: its first process
    is the subreaper of its descendants, and the reaper kills what is left when it ends."""
    ex = await h.executor(cgroup_limits=False)
    assert "not enforced" in ex.backend.limits
    marker = f"{time.time_ns() % 1000 + 1000}.25"  # a sleep of this length is the escaped process
    pids = tmp_path / "escaped.pid"
    job = await h.submit(command=f"setsid sleep {marker} >/dev/null 2>&1 & echo $! > {pids}; sleep 0.3")
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    escaped = int(pids.read_text())
    await h.wait_for(lambda: process_start_time(escaped) is None, 5, "the escaped process to be killed")
    assert processes_with(f"sleep\0{marker}".encode()) == []
