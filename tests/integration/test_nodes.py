"""A node whose heartbeat stops leaves the inventory and its running jobs are requeued; when it comes back,
they run again. A second executor process on this host plays the second machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.shared.contracts.api.nodes import NodeOut
from tests.integration.conftest import Platform, wait_for

pytestmark = pytest.mark.integration

NODE_TIMEOUT = 3.0
MARKER = "61.2345"  # the job's sleep: its process is checked for it before it is killed


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("nodes")
    env = {"GPUYARD_NODE_TIMEOUT": str(NODE_TIMEOUT), "GPUYARD_HEARTBEAT_INTERVAL": "0.5"}
    p = Platform(base / "data", base / "config", env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def start_node_b(platform: Platform, log: Path) -> subprocess.Popen:
    env = {
        **platform.joining_env("executor"),
        "GPUYARD_NODE_NAME": "node-b",
        "GPUYARD_SIMULATE_GPUS": "2",
        "GPUYARD_SIMULATED_GPU_MODEL": "SIM-B",
        "GPUYARD_HEARTBEAT_INTERVAL": "0.5",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard.services.executor"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def node(platform: Platform, name: str) -> NodeOut | None:
    return next((n for n in platform.client().nodes() if n.node == name), None)


def kill_job_processes(pidfile: Path) -> None:
    """End the job's processes that this test started (each attempt wrote its pid), and only those: a pid is
    killed only while it is still that job's `sleep` (not a process that reused the number)."""
    if not pidfile.exists():
        return
    for pid in {int(line) for line in pidfile.read_text().split()}:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # already gone
        if cmdline[:2] == [b"sleep", MARKER.encode()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_lost_node_is_taken_out_and_its_job_requeued_then_runs_again_when_it_returns(platform, tmp_path):
    client = platform.client()
    log, pidfile = tmp_path / "node-b.log", tmp_path / "pids"
    node_b = start_node_b(platform, log)
    try:
        wait_for(lambda: (n := node(platform, "node-b")) and n.state == "ready", 30, what="node-b")
        command = f"echo $$ >> {pidfile}; exec sleep {MARKER}"
        spec = {"command": command, "resources": {"gpus": 1, "gpu_model": ["SIM-B"], "cpus": 0.1}}
        job_id = client.submit(spec).job_id
        running = platform.wait_state(job_id, {"running"}, timeout=40)
        assert running.placements[0].node == "node-b"
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="the job's pid")

        os.kill(node_b.pid, signal.SIGKILL)  # the machine goes away: no goodbye, no more heartbeats
        node_b.wait(10)
        kill_job_processes(pidfile)  # what the machine's loss would have taken with it
        requeued = platform.wait_state(job_id, {"queued"}, timeout=NODE_TIMEOUT + 20)
        assert requeued.attempt == 2
        last = requeued.attempts[0]
        assert last.summary == "requeued: node_lost" and "node-b" in last.message
        assert node(platform, "node-b").state == "lost"
        waiting = wait_for(lambda: (j := client.job(job_id)).pending and j, 20, what="a reason")
        assert "SIM-B" in waiting.pending.message or waiting.pending.code == "no_matching_gpu_model"

        node_b = start_node_b(platform, log)  # the machine is back
        again = platform.wait_state(job_id, {"running"}, timeout=40)
        assert again.attempt == 2 and again.placements[0].node == "node-b"
        assert node(platform, "node-b").state == "ready"
        client.cancel(job_id)
        assert platform.wait_state(job_id, {"cancelled"}, timeout=40).state == "cancelled"
    finally:
        node_b.send_signal(signal.SIGTERM)
        node_b.wait(30)
        kill_job_processes(pidfile)
