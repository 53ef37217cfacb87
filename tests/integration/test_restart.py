"""`gpuyard up` stopped and started again on the same data directory keeps every job."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_jobs_survive_a_restart_and_nothing_is_left_behind(tmp_path):
    p = Platform(tmp_path / "data", tmp_path / "config").start()
    client = p.client()
    done = client.submit({"name": "before", "command": "true", "resources": {"gpus": 1}}).job_id
    p.wait_state(done, {"succeeded"})
    waiting = client.submit({"name": "waits", "command": "true", "resources": {"gpus": 8}}).job_id
    wait_for(lambda: client.job(waiting).pending, 15, what="a pending reason")
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
