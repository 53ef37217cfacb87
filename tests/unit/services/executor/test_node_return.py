"""A node that comes back, and a node that joins: what a restarted executor finds at its start.

- A node lost while its replicas ran on (its executor killed, its machine cut off): the scheduler requeued the
  attempt meanwhile. Back, its executor stops what still runs of that attempt (`Backend.stop_leftovers`),
  and keeps what the job still runs here.
- A node that starts after a gang was placed across it and others, when the others' replicas have already
  started (the job is running): it starts its own replica, never records the attempt lost."""

from __future__ import annotations

import json

from gpuyard.services.executor.exits import AttemptKey
from gpuyard.services.executor.leftovers import attempts_with_pid_files, running_attempts
from gpuyard.services.executor.pidfiles import pid_file
from gpuyard.services.executor.processes import process_start_time
from gpuyard.shared.contracts.events.jobs import JobStarted


def crash(ex) -> None:
    """The executor dies without stopping anything (its reaper goes on): forget its replicas as a crash would."""
    ex.backend.replicas.clear()
    for task in list(ex.backend.watchers):
        task.cancel()
    ex.backend.reaper.close()
    ex.attempts._held.clear()


async def test_what_runs_of_an_attempt_requeued_while_the_node_was_away_is_stopped_on_its_return(h, tmp_path):
    ex = await h.executor()
    go = tmp_path / "go"
    job = await h.submit(command=f"while [ ! -e {go} ]; do sleep 0.05; done")
    await h.place(ex, job)
    await h.wait(job, "running")
    record = json.loads(pid_file(h.data_dir, job, 1, 0).read_text())
    crash(ex)
    await h.ledger.requeue_lost(await h.view(job), "node node-a lost: no heartbeat")  # (the scheduler)
    assert list(running_attempts(h.data_dir, "node-a")) == [(job, 1)]
    assert running_attempts(h.data_dir, "node-b") == {}  # (another node's replicas are not this one's)

    again = await h.executor()
    await again.reconcile()
    await h.wait_for(lambda: process_start_time(record["pid"]) is None, 10, "the leftover to be stopped")
    assert not pid_file(h.data_dir, job, 1, 0).exists() and attempts_with_pid_files(h.data_dir) == []
    view = await h.view(job)
    assert view.state == "queued" and view.attempt == 2  # nothing recorded of attempt 1 on the way


async def test_what_the_job_still_runs_here_is_kept(h, tmp_path):
    ex = await h.executor()
    go = tmp_path / "go"
    job = await h.submit(command=f"while [ ! -e {go} ]; do sleep 0.05; done")
    await h.place(ex, job)
    await h.wait(job, "running")
    record = json.loads(pid_file(h.data_dir, job, 1, 0).read_text())
    crash(ex)

    again = await h.executor()
    await again.reconcile()
    assert await again.wanted_here(AttemptKey(job, 1)) and not await again.wanted_here(AttemptKey(job, 2))
    assert not await again.wanted_here(AttemptKey("no-such-job", 1))
    assert process_start_time(record["pid"]) == record["start"]  # adopted, not stopped
    go.touch()
    assert (await h.wait(job, "succeeded")).attempt == 1


async def test_a_node_that_starts_after_the_others_of_its_gang_starts_its_replica(h, tmp_path):
    runs = tmp_path / "runs"
    other = await h.executor(node_name="node-b")
    job = await h.submit(command=f"echo $GPUYARD_REPLICA >> {runs}", replicas=2)
    await h.place(other, job, nodes=["node-b", "node-a"])  # node-a has no executor yet
    await h.record(other, JobStarted(job_id=job, attempt=1, node="node-b", replicas=[0]))
    assert (await h.view(job)).state == "running"

    joined = await h.executor()
    await joined.reconcile()
    await h.wait_for(lambda: runs.exists() and "1" in runs.read_text().split(), 10, "node-a's replica to run")
    view = await h.view(job)
    assert view.attempt == 1 and 1 in view.current.started
