"""GPU health, cordon and drain on the real platform (`gpuyard up --simulate-gpus 2`, its NATS server, event
store, scheduler, executors and monitor): the test publishes node-a's `gpu.sample` with a fatal XID on GPU 1
itself, with the monitor's credentials (as tests/integration/test_alerts.py does); the monitor marks the GPU
unhealthy, the scheduler requeues the job running there with `gpu_unhealthy` (the executor stops it) and places
new jobs on GPU 0 only. A cordoned node takes no new job until it is uncordoned."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gpuyard.client import ClientError
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuReading, GpuSample
from gpuyard.shared.contracts.jobstate import JobState

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration

STOPPABLE = "trap 'echo got-term; exit 0' TERM; echo ready; sleep 120 & wait"
LIVE = [JobState.QUEUED, JobState.PLACED, JobState.RUNNING]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-health")
    p = Platform(base / "data", base / "config", simulate_gpus=2, env={"GPUYARD_PENDING_AFTER": "0"}).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


@pytest.fixture(autouse=True)
def no_jobs_left(platform):
    yield
    client = platform.client()
    for job in client.jobs(state=LIVE, limit=500).items:
        if not job.cancel_requested:
            with contextlib.suppress(ClientError):
                client.cancel(job.job_id)
    wait_for(lambda: not client.jobs(state=LIVE).items, 30, 0.2, "every job to end")


def submit(client, name: str) -> str:
    spec = {"name": name, "command": STOPPABLE, "resources": {"gpus": 1, "cpus": 1, "memory": "100MB"}}
    return client.submit(spec).job_id


def gpu_of(client, job_id: str) -> int:
    [placement] = client.job(job_id).placements
    [share] = placement.gpus
    return share.index


def events(client, job_id: str, kind: str) -> list[dict]:
    return [e.event for e in client.events(job_id) if e.event["type"] == f"io.gpuyard.job.{kind}"]


def publish_broken_gpu_1(platform: Platform) -> None:
    sample = GpuSample(
        node="node-a",
        gpus=[
            GpuReading(index=0, uuid="GPU-0"),
            GpuReading(index=1, uuid="GPU-1", xids=[79], last_xid=79),  # fallen off the bus: fatal
        ],
    )

    async def go():
        bus = await platform.bus("monitor")
        try:
            await bus.publish(make_event(sample, source="/test/monitor"))
        finally:
            await bus.close()

    asyncio.run(go())


def gpu_1(platform: Platform):
    [node] = [n for n in platform.client().nodes() if n.node == "node-a"]
    return node.gpus[1]


def test_a_job_on_an_unhealthy_gpu_is_requeued_and_new_jobs_land_only_on_the_other_gpu(platform):
    client = platform.client()
    first, second = submit(client, "first"), submit(client, "second")
    platform.wait_state(first, {"running"})
    platform.wait_state(second, {"running"})
    on_gpu_1 = first if gpu_of(client, first) == 1 else second
    on_gpu_0 = second if on_gpu_1 == first else first
    wait_for(lambda: "ready" in client.logs(on_gpu_1), 10, 0.1, "the job on GPU 1 to say ready")

    publish_broken_gpu_1(platform)
    requeued = wait_for(lambda: events(client, on_gpu_1, "requeued"), 30, 0.2, "job.requeued")
    data = requeued[0]["data"]
    assert data["reason"] == "gpu_unhealthy" and "GPU 1 of node node-a is unhealthy" in data["message"]
    assert "fatal XID 79" in data["message"]
    health = wait_for(lambda: not (g := gpu_1(platform)).healthy and g, 10, 0.2, "GPU 1 shown unhealthy")
    assert health.unhealthy_reason == "fatal XID 79"
    wait_for(lambda: "got-term" in client.logs(on_gpu_1, attempt=1), 30, 0.2, "the old attempt stopped")

    waiting = wait_for(lambda: (j := client.job(on_gpu_1)).pending and j, 15, 0.2, "a pending reason")
    assert waiting.state == "queued" and waiting.attempt == 2
    client.cancel(on_gpu_0)  # GPU 0 frees: the requeued job goes there, never on GPU 1
    platform.wait_state(on_gpu_1, {"running"})
    assert gpu_of(client, on_gpu_1) == 0
    third = submit(client, "third")
    reason = wait_for(lambda: client.job(third).pending, 15, 0.2, "the third job to wait")
    assert "1 GPU unhealthy or cordoned" in reason.message
    assert client.job(third).state == "queued"

    client.node_control("node-a", "uncordon", gpu=1)  # an admin's reset: GPU 1 takes work again
    platform.wait_state(third, {"running"})
    assert gpu_of(client, third) == 1 and gpu_1(platform).healthy


def test_a_cordoned_node_takes_no_new_job_until_it_is_uncordoned(platform):
    client = platform.client()
    done = platform.cli("nodes", "cordon", "node-a", "--reason", "maintenance")
    assert done.returncode == 0, done.stderr
    [node] = [n for n in client.nodes() if n.node == "node-a"]
    assert node.state == "cordoned" and node.reason == "maintenance"
    job = submit(client, "waits")
    reason = wait_for(lambda: client.job(job).pending, 15, 0.2, "the job to wait")
    assert "1 node cordoned" in reason.message and client.job(job).state == "queued"
    assert platform.cli("nodes", "uncordon", "node-a").returncode == 0
    platform.wait_state(job, {"running"})


def test_a_drain_requeues_the_running_job_like_a_preemption(platform):
    client = platform.client()
    job = submit(client, "drained")
    platform.wait_state(job, {"running"})
    wait_for(lambda: "ready" in client.logs(job), 10, 0.1, "the job to say ready")
    assert platform.cli("nodes", "drain", "node-a").returncode == 0
    preempted = wait_for(lambda: events(client, job, "preempted"), 30, 0.2, "job.preempted")
    assert (preempted[0]["data"]["cause"], preempted[0]["data"]["node"]) == ("drain", "node-a")
    requeued = wait_for(lambda: events(client, job, "requeued"), 30, 0.2, "job.requeued")
    assert requeued[0]["data"]["reason"] == "preempted"
    assert "got-term" in client.logs(job, attempt=1)
    drained = client.job(job)
    assert drained.state == "queued"
    ended = drained.attempts[0]
    assert (ended.outcome, ended.preemption, ended.node) == ("preempted", "drain", "node-a")
    assert ended.message == "drain: node node-a is being drained"
    assert platform.cli("nodes", "uncordon", "node-a").returncode == 0
    platform.wait_state(job, {"running"})
