"""A replica adopted by a restarted executor whose reaper (the earlier executor's) is then killed: when the
replica ends, no exit file says how, and the attempt is requeued as lost (`node_lost`, as docs/executor.md
says), never failed: its end is not the job's doing, and retrying it is not counted against `max_retries`."""

from __future__ import annotations

import json
import os
import signal

import pytest

from gpuyard.services.executor import reaper_client
from gpuyard.services.executor.pidfiles import pid_file
from gpuyard.services.executor.processes import process_start_time
from gpuyard.shared.runtime.paths import replica_files
from tests.unit.services.executor.harness import Harness


@pytest.fixture
async def h(tmp_path):
    harness = await Harness(tmp_path).open()
    yield harness
    await harness.close()


@pytest.fixture(autouse=True)
def short_exit_file_wait(monkeypatch):
    """An ended replica's exit file is waited for half a second, not five: its reaper is dead, none comes."""
    monkeypatch.setattr(reaper_client, "EXIT_FILE_WAIT", 0.5)


def crash(ex) -> None:
    """The executor dies without stopping anything (its reaper goes on): forget its replicas as a crash would."""
    ex.backend.replicas.clear()
    for task in list(ex.backend.watchers):
        task.cancel()
    ex.backend.reaper.close()
    ex.attempts._held.clear()


async def adopted_then_reaper_killed(h: Harness, go, **spec) -> tuple[str, dict]:
    """A job started by an executor that crashed, adopted by the next one, whose reaper is then killed: its
    replica runs on, an orphan, until `go` exists. Returns the job and its pid file's record."""
    first = await h.executor()
    job = await h.submit(command=f"while [ ! -e {go} ]; do sleep 0.05; done; echo done", **spec)
    await h.place(first, job)
    await h.wait(job, "running")
    record = json.loads(pid_file(h.data_dir, job, 1, 0).read_text())
    crash(first)

    again = await h.executor()
    await again.reconcile()
    assert again.backend.sessions((job, 1)) == {0: record["pid"]}  # adopted: watched again
    assert (await h.view(job)).state == "running"

    os.kill(record["reaper"], signal.SIGKILL)
    await h.wait_for(lambda: process_start_time(record["reaper"]) is None, 5, "the reaper's end")
    assert process_start_time(record["pid"]) == record["start"]  # the replica outlives it
    return job, record


async def test_an_adopted_replica_whose_reaper_was_killed_is_requeued_as_lost_when_it_ends(h, tmp_path):
    go = tmp_path / "go"
    job, record = await adopted_then_reaper_killed(h, go)
    go.touch()  # it runs to its end (exit 0), which no one can learn any more
    view = await h.wait(job, "queued", "failed", "succeeded")
    assert view.state == "queued", (view.state, view.failure_reason, view.message)
    [lost] = view.attempts[:1]
    assert view.attempt == 2 and lost.summary == "requeued: node_lost"
    assert "its exit status was lost" in lost.message and "replica 0" in lost.message
    assert not os.path.exists(replica_files(h.data_dir, job, 1, 0).exit)  # (no reaper wrote one)
    types = await h.types(job)
    assert types[-2:] == ["replica_exited", "requeued"] and "failed" not in types


async def test_retries_are_not_spent_on_a_lost_attempt(h, tmp_path):
    go = tmp_path / "go"
    job, _ = await adopted_then_reaper_killed(h, go, max_retries=1)
    go.touch()
    view = await h.wait(job, "queued", "failed", "succeeded")
    assert view.attempt == 2 and view.attempts[0].summary == "requeued: node_lost", view.attempts[0]
