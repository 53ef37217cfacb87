"""`gpuyard up` stopped and started again on the same data directory keeps every job; an executor killed
while its jobs run or end neither loses nor reruns any of them."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from gpuyard.shared.contracts.reasons import PendingCode

from .conftest import Platform, wait_for
from .processes import service_processes

pytestmark = pytest.mark.integration


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_jobs_survive_a_restart_and_nothing_is_left_behind(tmp_path):
    accepting = {"GPUYARD_ACCEPT_UNPLACEABLE": "true"}  # a job too big for this cluster waits for it to grow
    p = Platform(tmp_path / "data", tmp_path / "config", env=accepting).start()
    client = p.client()
    done = client.submit({"name": "before", "command": "true", "resources": {"gpus": 1}}).job_id
    p.wait_state(done, {"succeeded"})
    waiting = client.submit({"name": "waits", "command": "true", "resources": {"gpus": 8}}).job_id
    pending = wait_for(lambda: client.job(waiting).pending, 15, what="a pending reason")
    assert pending.code == PendingCode.TOO_LARGE and "needs 8 GPUs on one node" in pending.message
    assert "needs 8 GPUs" in p.cli("ps").stdout
    pids = [s.pid for s in client.services()]
    assert p.stop() == 0
    assert not port_open(p.port) and not port_open(p.nats_port)
    for pid in pids:
        wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 5, what=f"process {pid} to end")

    p.start()
    client = p.client()
    jobs = {j.job_id: j for j in client.jobs(limit=50).items}
    assert jobs[done].state == "succeeded"
    assert jobs[waiting].state == "queued"
    after = client.submit({"name": "after", "command": "true", "resources": {"gpus": 1}}).job_id
    assert p.wait_state(after, {"succeeded"}).state == "succeeded"
    assert p.stop() == 0


def executor_processes(up: int) -> list[int]:
    """The executor processes `gpuyard up` runs now."""
    return service_processes(up, "executor")


def test_an_executor_killed_while_its_jobs_run_and_end_neither_loses_nor_reruns_any(tmp_path):
    """SIGKILL of the executor: jobs that end while it is away are reported with their real exit codes, jobs
    that outlive its restart are adopted and end once; each command runs exactly once."""
    p = Platform(tmp_path / "data", tmp_path / "config", simulate_gpus=8, executors=1).start()
    try:
        client = p.client()
        marks, short_go, long_go = tmp_path / "marks", tmp_path / "short-go", tmp_path / "long-go"
        marks.mkdir()

        def job(name: str, go: Path, code: int) -> str:
            command = (
                f"echo $GPUYARD_ATTEMPT >> {marks}/{name}; echo {name} says hello; "
                f"while [ ! -e {go} ]; do sleep 0.05; done; echo {name} ends; exit {code}"
            )
            resources = {"gpus": 1, "cpus": 0.1, "memory": "64MiB"}  # (8 jobs on a 2-core machine)
            return client.submit({"name": name, "command": command, "resources": resources}).job_id

        short = {job(f"short{i}", short_go, code): code for i, code in enumerate([0, 0, 3, 0])}
        long = {job(f"long{i}", long_go, code): code for i, code in enumerate([0, 5, 0, 0])}
        for job_id in [*short, *long]:
            p.wait_state(job_id, {"running"})
        wait_for(lambda: len(list(marks.iterdir())) == 8, 10, what="every job's first line")
        [executor] = executor_processes(p.proc.pid)

        os.kill(p.proc.pid, signal.SIGSTOP)  # `gpuyard up` held: it restarts no executor until it goes on
        try:
            os.kill(executor, signal.SIGKILL)
            short_go.touch()  # the short jobs end while no executor runs
            attempts = p.data_dir / "jobs"
            exits = [attempts / job_id / "attempt-1" / "replica-0.exit" for job_id in short]
            wait_for(lambda: all(f.exists() for f in exits), 30, what="the short jobs' exit files")
            assert executor_processes(p.proc.pid) == []
        finally:
            os.kill(p.proc.pid, signal.SIGCONT)

        def ended(job_id: str, code: int) -> None:
            done = p.wait_state(job_id, {"succeeded", "failed"}, timeout=60)
            assert (done.state, done.attempt, done.attempts[-1].exit_code) == (
                "succeeded" if code == 0 else "failed",
                1,
                code,
            ), done

        for job_id, code in short.items():
            ended(job_id, code)
        for job_id in long:
            assert client.job(job_id).state == "running"  # adopted, not requeued
        long_go.touch()
        for job_id, code in long.items():
            ended(job_id, code)
        for job_id in [*short, *long]:  # each is over: its history is complete
            kinds = [e.event["type"].rsplit(".", 1)[1] for e in client.events(job_id)]
            assert kinds.count("started") == 1 and "requeued" not in kinds, kinds
            name = client.job(job_id).name
            assert (marks / name).read_text() == "1\n", name  # its command ran exactly once
            output = wait_for(  # (its output reaches the log store a moment after its end)
                lambda job_id=job_id, name=name: (
                    (text := client.logs(job_id)) and f"{name} ends" in text and text
                ),
                30,
                what=f"{name}'s last line in its logs",
            )
            assert output.count(f"{name} says hello") == 1 and output.count(f"{name} ends") == 1, output
    finally:
        p.stop()
