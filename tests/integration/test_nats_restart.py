"""NATS restarts under a running platform (`gpuyard up` starts it again): the scheduler goes on placing.

Before, the scheduler's heartbeat watch (an ordered consumer started by time) failed every reset after the
restart, so the node was declared lost and every new job waited for nodes.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
import pytest

from .conftest import Platform, wait_for
from .servicemetrics import handled, metrics_addresses, scrape

pytestmark = pytest.mark.integration

NODE_TIMEOUT = 4.0
HEARTBEAT_INTERVAL = 1.0
HEARTBEATS_PAST_TIMEOUT = round(3 * NODE_TIMEOUT / HEARTBEAT_INTERVAL)
"""Heartbeats the node sends in three node timeouts: a scheduler that handled that many since the restart has
heard the node all along, where one that heard none would have lost it."""


def nats_pid(platform: Platform) -> int | None:
    """The nats-server that `gpuyard up` runs as its child."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == platform.proc.pid and b"nats-server" in cmdline:
            return int(proc.name)
    return None


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_jobs_are_placed_after_nats_restarts(tmp_path):
    env = {"GPUYARD_NODE_TIMEOUT": str(NODE_TIMEOUT), "GPUYARD_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL)}
    p = Platform(tmp_path / "data", tmp_path / "config", env=env).start()
    try:
        client = p.client()
        before = client.submit({"command": "true", "resources": {"gpus": 1}}).job_id
        assert p.wait_state(before, {"succeeded"}).state == "succeeded"
        scheduler = metrics_addresses(p)["scheduler"]

        def heartbeats_heard() -> float:
            return handled(scrape(scheduler), "scheduler-heartbeats", subject="node.heartbeat")

        def heard_since(heard: float) -> bool:
            try:
                return heartbeats_heard() >= heard + HEARTBEATS_PAST_TIMEOUT
            except httpx.HTTPError:  # (not answering this moment: asked again)
                return False

        old = wait_for(lambda: nats_pid(p), 10, what="the nats-server child")
        os.kill(old, signal.SIGKILL)
        wait_for(
            lambda: (pid := nats_pid(p)) and pid != old and listening(p.nats_port), 30, what="NATS again"
        )
        heard = heartbeats_heard()
        wait_for(  # a scheduler whose heartbeat watch did not survive the restart never gets there
            lambda: heard_since(heard),
            60,
            0.5,
            f"the scheduler to hear {HEARTBEATS_PAST_TIMEOUT} of the node's heartbeats after the restart",
        )

        after = client.submit({"command": "true", "resources": {"gpus": 1}}).job_id
        job = p.wait_state(after, {"succeeded"}, timeout=40)
        assert job.state == "succeeded"
    finally:
        p.stop()
