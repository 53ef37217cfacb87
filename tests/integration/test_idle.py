"""Idle-GPU reclaim on the real platform (`gpuyard up --simulate-gpus 2`: its NATS server, event store, monitor
and executors), with short idle settings: a `sleep` job whose GPU reads idle is warned (an `idle.warning` on the
bus, a `job_idle` alert, a line in its output), then stopped and ends `failed`, reason `idle`, with the
figures; a busy job with the same idle timeout runs on through the same time; the sleeping job's GPU goes back
to the queue."""

from __future__ import annotations

import sys
import threading

import pytest

from tests.integration.conftest import Platform, sse_events, wait_for

pytestmark = pytest.mark.integration

IDLE = {"idle_timeout": 3, "idle_grace": 2}
BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("idle")
    env = {
        "GPUYARD_SAMPLE_INTERVAL": "0.5",
        "GPUYARD_JOBS_INTERVAL": "0.5",
        "GPUYARD_IDLE_MIN_AGE": "1",
        "GPUYARD_GRACE_SECONDS": "2",
    }
    p = Platform(base / "data", base / "config", env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def test_an_idle_job_is_warned_then_stopped_and_a_busy_one_is_not(platform: Platform):
    client = platform.client()
    seen: list[dict] = []
    connected = threading.Event()

    def listen():
        seen.extend(sse_events(platform.server, client.token, {"subject": "idle.>"}, 2, 60, connected))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert connected.wait(20), "the event stream did not connect"

    idle = client.submit(
        {"name": "sleepy", "command": ["sleep", "600"], "resources": {"gpus": 1}, **IDLE}
    ).job_id
    busy = client.submit({"name": "busy", "command": BUSY, "resources": {"gpus": 1}, **IDLE}).job_id
    try:
        platform.wait_state(idle, {"running"})
        platform.wait_state(busy, {"running"})

        alert = wait_for(
            lambda: next(
                (a for a in client.alerts(state="all", kind="job_idle").items if a.job_id == idle), None
            ),
            30,
            0.2,
            "the job_idle alert",
        )
        assert alert.alert_id == f"job_idle/{idle}/1" and alert.threshold == 5.0 and alert.value < 5.0
        wait_for(
            lambda: "[gpuyard] idle: GPUs below 5% for 3s" in client.logs(idle), 20, 0.2, "the warning line"
        )

        ended = platform.wait_state(idle, {"failed", "succeeded", "cancelled"}, timeout=30)
        assert ended.state == "failed" and ended.failure is not None, ended
        assert ended.failure.reason == "idle" and ended.attempt == 1
        message = ended.failure.message
        assert "every sample under 5% utilization for" in message and "idle timeout 3s, grace 2s" in message
        assert "highest" in message, message
        assert "[gpuyard] idle: stopped for idle GPUs" in client.logs(idle)
        assert client.job(busy).state == "running"  # the same timeout, and as long: not idle

        listener.join(20)
        kinds = [(e["type"], e["data"]["job_id"]) for e in seen]
        assert kinds == [("io.gpuyard.idle.warning", idle), ("io.gpuyard.idle.stop", idle)], seen
        warning = seen[0]["data"]
        assert warning["threshold_pct"] == 5.0 and warning["window_seconds"] == 3.0
        assert warning["grace_seconds"] == 2.0 and warning["max_utilization_pct"] < 5.0

        resolved = wait_for(
            lambda: next(
                (a for a in client.alerts(state="resolved", kind="job_idle").items if a.job_id == idle), None
            ),
            20,
            0.2,
            "the job_idle alert resolved",
        )
        assert resolved.resolved_message == "the job was stopped for idle GPUs"

        # its GPU went back to the queue: the only one free (the busy job holds the other) runs the next job
        after = client.submit({"name": "after", "command": ["true"], "resources": {"gpus": 1}}).job_id
        assert platform.wait_state(after, {"succeeded"}, timeout=30).state == "succeeded"
        described = platform.cli("describe", idle)
        assert "idle: stopped for idle GPUs" in described.stdout and "Idle timeout" in described.stdout
    finally:
        client.cancel(busy)
    platform.wait_state(busy, {"cancelled"})
