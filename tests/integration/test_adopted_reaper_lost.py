"""The whole platform: an executor killed while its job runs is restarted by `gpuyard up`, and the new one
adopts the replica; then the earlier executor's reaper, the replica's parent, is killed too, and the replica
runs to its end. How it ended can no longer be known: the attempt is requeued as lost (`node_lost`), never
failed, the scheduler places it again and attempt 2 runs; the output of both attempts is read through the API."""

from __future__ import annotations

import json
import os
import signal

import pytest

from gpuyard.services.executor.processes import process_start_time

from .conftest import Platform, wait_for
from .test_restart import executor_processes

pytestmark = pytest.mark.integration


def test_a_replica_whose_reaper_is_killed_after_its_adoption_is_requeued_as_lost(tmp_path):
    p = Platform(tmp_path / "data", tmp_path / "config", simulate_gpus=1, executors=1).start()
    try:
        client = p.client()
        go = tmp_path / "go"
        command = (
            f"echo attempt $GPUYARD_ATTEMPT starts; while [ ! -e {go} ]; do sleep 0.05; done; "
            "echo attempt $GPUYARD_ATTEMPT ends"
        )
        spec = {
            "name": "orphaned",
            "command": command,
            "resources": {"gpus": 1, "cpus": 0.1, "memory": "64MiB"},
        }
        job_id = client.submit(spec).job_id
        p.wait_state(job_id, {"running"})
        pid_file = p.data_dir / "jobs" / job_id / "attempt-1" / "replica-0.pid"
        record = wait_for(
            lambda: pid_file.exists() and json.loads(pid_file.read_text()), 10, what="its pid file"
        )
        [executor] = executor_processes(p.proc.pid)

        os.kill(executor, signal.SIGKILL)  # `gpuyard up` starts another, which adopts the replica
        wait_for(
            lambda: (now := executor_processes(p.proc.pid)) and now != [executor] and now,
            30,
            what="the executor started again",
        )
        reader = pid_file.with_name("replica-0.reader")  # written by the executor that reads its output again
        adopted = wait_for(lambda: reader.exists() and reader.read_text().strip(), 30, what="its adoption")
        assert int(adopted) != executor and client.job(job_id).state == "running"

        os.kill(record["reaper"], signal.SIGKILL)
        wait_for(lambda: process_start_time(record["reaper"]) is None, 10, what="the reaper's end")
        assert process_start_time(record["pid"]) == record["start"]  # the replica runs on, an orphan
        go.touch()  # it ends (exit 0): no one is left to learn it

        done = p.wait_state(job_id, {"succeeded", "failed"}, timeout=60)
        assert (done.state, done.attempt) == ("succeeded", 2), done
        lost = done.attempts[0]
        assert lost.summary == "requeued: node_lost" and "its exit status was lost" in lost.message, lost
        kinds = [e.event["type"].rsplit(".", 1)[1] for e in client.events(job_id)]
        assert "failed" not in kinds and kinds.count("requeued") == 1, kinds

        first = wait_for(
            lambda: "attempt 1 ends" in (text := client.logs(job_id, attempt=1)) and text,
            30,
            what="attempt 1's last line in the log store",
        )
        assert first == "attempt 1 starts\nattempt 1 ends\n"
        every = wait_for(
            lambda: "attempt 2 ends" in (text := client.logs(job_id, attempt="all")) and text,
            30,
            what="attempt 2's last line in the log store",
        )
        assert every.splitlines()[0].startswith(
            "[gpuyard] attempt 1: requeued: node_lost (replica 0: its exit"
        )
        assert every.splitlines()[1:3] == ["attempt 1 starts", "attempt 1 ends"]
        assert every.splitlines()[3:] == [
            "[gpuyard] attempt 2: succeeded",
            "attempt 2 starts",
            "attempt 2 ends",
        ]
    finally:
        p.stop()
