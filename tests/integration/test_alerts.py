"""Alerts on the real platform (`gpuyard up`, its NATS server and event store): the platform's own monitor
evaluates the rules (a rules file and a webhook given to `gpuyard up`); it samples its simulated GPUs once and
then rarely, so that the test publishes node-a's `gpu.sample` itself with the monitor's credentials. Every rule
is raised and resolved: a job waiting, a running job silent, a GPU too hot, over its power limit, with a fatal
XID, an application XID, uncorrectable ECC errors, lost, an allocated GPU idle, a node lost (a second executor
that stops); the webhook receiver fails its first tries and still gets every alert, in order; a monitor killed
and restarted by `gpuyard up` raises nothing twice; a tenant sees only the alerts about its own jobs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuyard.client import Client
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading, GpuSample
from tests.integration.conftest import Platform, wait_for
from tests.integration.processes import service_processes

pytestmark = pytest.mark.integration

RULES = """
rules:
  gpu_temperature: {for: 1s, keep_firing_for: 1s}
  gpu_idle: {for: 1s}
  job_waiting: {for: 1s}
  job_silent: {for: 3s}
  node_lost: {keep_firing_for: 0}
  gpu_power: {for: 0, keep_firing_for: 0}
  gpu_xid: {keep_firing_for: 1s}
  job_xid: {keep_firing_for: 1s}
  gpu_lost: {keep_firing_for: 0}
"""
FAILED_TRIES = 2


class Receiver:
    """A webhook: answers 500 to its first FAILED_TRIES POSTs, then 200; keeps what it got."""

    def __init__(self):
        self.tries = 0
        self.bodies: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.tries += 1
                ok = receiver.tries > FAILED_TRIES
                if ok:
                    receiver.bodies.append(body)
                self.send_response(200 if ok else 500)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/slack"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def got(self, alert_id: str, status: str) -> bool:
        return any(b["alert"]["alert_id"] == alert_id and b["status"] == status for b in self.bodies)


@pytest.fixture(scope="module")
def hook():
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture(scope="module")
def platform(tmp_path_factory, hook):
    base = tmp_path_factory.mktemp("alerts")
    rules = base / "rules.yaml"
    rules.write_text(RULES)
    env = {
        "GPUYARD_NODE_TIMEOUT": "3",
        "GPUYARD_HEARTBEAT_INTERVAL": "0.5",
        "GPUYARD_ALERT_RULES": str(rules),
        "GPUYARD_ALERT_WEBHOOKS": hook.url,
        "GPUYARD_WEBHOOK_MAX_BACKOFF": "0.2",
        "GPUYARD_SAMPLE_INTERVAL": "3600",  # node-a's samples are the test's (its monitor samples once)
    }
    p = Platform(base / "data", base / "config", env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def leading(platform: Platform) -> int:
    """How many times a monitor of the platform took the alert rules on."""
    return platform.log.read_text().count("evaluating the alert rules")


def alerts(client: Client, state: str = "all"):
    return client.alerts(state=state, limit=500).items


def active(client: Client) -> set[str]:
    return {a.alert_id for a in alerts(client, "active")}


def occurrences(client: Client, alert_id: str) -> list[str]:
    return [a.state for a in alerts(client) if a.alert_id == alert_id]


def resolved(client: Client, alert_id: str) -> bool:
    return occurrences(client, alert_id)[:1] == ["resolved"]


def sample(node: str, *, temp: float, util: float, job_id: str, broken: bool = False) -> GpuSample:
    """Node-a's two GPUs, both held by the job: GPU 0 at `temp`; GPU 1, when `broken`, over its power limit,
    with a fatal and an application XID, uncorrectable ECC errors, and lost."""
    holder = GpuHolder(job_id=job_id, tenant="vision", user="ana")
    return GpuSample(
        node=node,
        gpus=[
            GpuReading(
                index=i, uuid=f"GPU-{i}", utilization_pct=util, memory_used_bytes=0, memory_total_bytes=1 << 30,
                temperature_c=temp if i == 0 else 40, power_w=350 if broken and i else 100, power_limit_w=300,
                xids=[79, 13] if broken and i else [], ecc_uncorrected=2 if broken and i else 0,
                lost=broken and i == 1, holders=[holder],
            )
            for i in (0, 1)
        ],
    )  # fmt: skip


def publish_until(platform: Platform, make, done, what: str, timeout: float = 30) -> None:
    """Publish `make()` as the node's monitor would, every 0.3 s, until `done()`."""

    async def go():
        bus = await platform.bus("monitor")
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not await asyncio.to_thread(done):
                assert loop.time() < deadline, f"timed out waiting for {what}"
                await bus.publish(make_event(make(), source="/test/monitor"))
                await asyncio.sleep(0.3)
        finally:
            await bus.close()

    asyncio.run(go())


def start_node_b(platform: Platform, log: Path) -> subprocess.Popen:
    env = {
        **platform.joining_env("executor"),
        "GPUYARD_NODE_NAME": "node-b",
        "GPUYARD_SIMULATE_GPUS": "1",
        "GPUYARD_HEARTBEAT_INTERVAL": "0.5",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard.services.executor"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def test_every_rule_is_raised_and_resolved_on_the_bus_in_the_store_and_at_the_webhook(
    platform, hook, tmp_path
):
    admin = platform.client()
    vision = Client(platform.server, admin.create_token(tenant="vision", user="ana").token, timeout=30)
    wait_for(lambda: leading(platform) >= 1, 60, what="the monitor evaluating the alert rules")
    # a job holding both GPUs of node-a (silent: no output, no GPU activity) and one waiting behind it
    holder = vision.submit({"name": "hold", "command": "sleep 600", "resources": {"gpus": 2}}).job_id
    platform.wait_state(holder, {"running"})
    waiting = vision.submit({"name": "behind", "command": "true", "resources": {"gpus": 2}}).job_id
    silent_id, waiting_id = f"job_silent/{holder}", f"job_waiting/{waiting}"
    wait_for(lambda: {silent_id, waiting_id} <= active(admin), 60, what="job_silent and job_waiting")
    seen = {a.alert_id: a for a in alerts(vision, "active")}
    assert seen[waiting_id].tenant == "vision" and seen[waiting_id].job_id == waiting
    assert seen[silent_id].severity == "warning" and "wrote no output" in seen[silent_id].message

    # a restarted monitor reads the active alerts first: none is raised again
    before = leading(platform)
    [monitor_pid] = service_processes(platform.proc.pid, "monitor")
    os.kill(monitor_pid, signal.SIGKILL)
    wait_for(lambda: leading(platform) > before, 60, what="the restarted monitor leading")
    admin.cancel(waiting)
    wait_for(lambda: resolved(admin, waiting_id), 60, what="job_waiting resolved after the restart")
    assert occurrences(admin, waiting_id) == ["resolved"]
    assert occurrences(admin, silent_id) == ["active"]

    # GPU 0 of node-a too hot, GPU 1 broken every way, both GPUs of the holder idle; then all well again
    temp_id, idle_id = "gpu_temperature/node-a/0", f"gpu_idle/node-a/1/{holder}"
    broken_ids = [f"{kind}/node-a/1" for kind in ("gpu_power", "gpu_xid", "gpu_ecc", "gpu_lost")]
    app_xid_id = f"job_xid/node-a/1/{holder}"
    gpu_ids = [temp_id, idle_id, app_xid_id, *broken_ids]
    publish_until(
        platform,
        lambda: sample("node-a", temp=95, util=0, job_id=holder, broken=True),
        lambda: set(gpu_ids) <= active(admin),
        "the GPU alerts raised",
    )
    now = {a.alert_id: a for a in alerts(admin, "active")}
    hot = now[temp_id]
    assert hot.severity == "warning" and hot.value == 95 and hot.threshold == 85 and hot.tenant is None
    assert now["gpu_xid/node-a/1"].severity == "critical" and now["gpu_xid/node-a/1"].value == 79
    assert now[app_xid_id].value == 13 and now[app_xid_id].tenant == "vision"
    assert now["gpu_power/node-a/1"].value == 350 and now["gpu_power/node-a/1"].threshold == 300
    theirs = {a.alert_id for a in alerts(vision)}
    assert temp_id not in theirs and not theirs & set(broken_ids)  # a GPU's alerts: admins only
    assert {idle_id, app_xid_id} <= theirs  # the job's idle GPU, its application error: its tenant's
    publish_until(
        platform,
        lambda: sample("node-a", temp=50, util=80, job_id=holder),
        lambda: all(resolved(admin, a) for a in [*gpu_ids, silent_id]),
        "the GPU alerts and job_silent resolved",
    )

    # a node lost, then back
    node_log = tmp_path / "node-b.log"
    node_b = start_node_b(platform, node_log)
    try:
        wait_for(lambda: any(n.node == "node-b" for n in admin.nodes()), 60, what="node-b")
        node_b.send_signal(signal.SIGKILL)
        node_b.wait(10)
        wait_for(lambda: "node_lost/node-b" in active(admin), 60, what="node_lost raised")
        lost = next(a for a in alerts(admin, "active") if a.alert_id == "node_lost/node-b")
        assert lost.severity == "critical" and lost.node == "node-b"
        node_b = start_node_b(platform, node_log)
        wait_for(lambda: resolved(admin, "node_lost/node-b"), 60, what="node_lost resolved")
    finally:
        if node_b.poll() is None:
            os.kill(node_b.pid, signal.SIGTERM)
            node_b.wait(30)
    admin.cancel(holder)

    # the webhook failed its first tries and still got every alert and every resolve, each once
    expected = [waiting_id, silent_id, *gpu_ids, "node_lost/node-b"]
    wait_for(
        lambda: all(hook.got(a, "firing") and hook.got(a, "resolved") for a in expected),
        30,
        what="every alert at the webhook",
    )
    assert hook.tries >= len(hook.bodies) + FAILED_TRIES
    ids = [b["event_id"] for b in hook.bodies]
    assert len(ids) == len(set(ids))
    first = {a: next(i for i, b in enumerate(hook.bodies) if b["alert"]["alert_id"] == a) for a in expected}
    for alert_id in expected:
        statuses = [b["status"] for b in hook.bodies if b["alert"]["alert_id"] == alert_id]
        assert statuses[:2] == ["firing", "resolved"], (alert_id, statuses)
    assert first[temp_id] < first["node_lost/node-b"]
    assert all(b["text"] and b["blocks"][0]["type"] == "section" for b in hook.bodies)
