"""`GET /v1/services` lets go of instances that are gone: a silent instance (no heartbeat for three intervals)
is listed `silent` for a minute, then no longer (80 s after its last heartbeat); and as soon as it is silent
when a newer instance of its service on its host runs in its place (its supervisor, or systemd, restarted it).
Times come from a clock the test moves: no sleep."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit import routes_platform, telemetry
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.routes_platform import GONE_AFTER_SECONDS, listed_services
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.services import (
    SERVICE_HEARTBEAT_SECONDS,
    ProcessState,
    ServiceHeartbeat,
    ServiceStatus,
)
from tests.unit.services.submit.submitctx import submit_context

T0 = 1_800_000_000.0
SILENT = 3 * SERVICE_HEARTBEAT_SECONDS + 6  # three intervals missed, and more: silent


class Clock:
    def __init__(self, monkeypatch):
        self.now = T0
        monkeypatch.setattr(telemetry.time, "time", lambda: self.now)
        monkeypatch.setattr(routes_platform.time, "time", lambda: self.now)


@pytest.fixture
def clock(monkeypatch):
    return Clock(monkeypatch)


def beat(clock: Clock, pid: int, service: str = "scheduler", host: str = "h", started: float | None = None):
    data = ServiceHeartbeat(
        service=service,
        instance=f"{host}-{pid}",
        pid=pid,
        host=host,
        started_at=datetime.fromtimestamp(clock.now if started is None else started, UTC),
        version="1.0",
    )
    return make_event(data, source="/test")


def status(pid: int, state: ProcessState, process: str = "scheduler", service: str = "scheduler", **more):
    data = ServiceStatus(
        service=service, process=process, host="h", pid=pid, state=state, version="1.0", **more
    )
    return make_event(data, source="/gpuyard/supervisor/h")


def listed(seen: telemetry.Telemetry, clock: Clock) -> dict[int, str]:
    return {row.pid: row.state.value for row in listed_services(seen, clock.now)}


def test_a_killed_instance_is_silent_for_a_minute_then_no_longer_listed(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(clock, 10))
    seen.observe(beat(clock, 20, service="monitor"))
    assert listed(seen, clock) == {10: "running", 20: "running"}
    for _ in range(4):  # the monitor goes on; the scheduler was killed and nothing restarts it
        clock.now += SILENT / 4
        seen.observe(beat(clock, 20, service="monitor"))
    assert listed(seen, clock) == {10: "silent", 20: "running"}
    clock.now = T0 + GONE_AFTER_SECONDS - 1
    seen.observe(beat(clock, 20, service="monitor"))
    assert listed(seen, clock) == {10: "silent", 20: "running"}  # still said: an operator sees it went quiet
    clock.now = T0 + GONE_AFTER_SECONDS + 1
    seen.observe(beat(clock, 20, service="monitor"))
    assert listed(seen, clock) == {20: "running"}
    assert {row.pid for row in seen.service_list(clock.now)} == {10, 20}  # (what was heard is kept)


def test_an_instance_that_was_only_stuck_is_listed_again_once_it_beats(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(clock, 10, started=T0 - 100))
    clock.now += GONE_AFTER_SECONDS + 1
    assert listed(seen, clock) == {}
    seen.observe(beat(clock, 10, started=T0 - 100))
    assert listed(seen, clock) == {10: "running"}


def test_an_instance_its_supervisor_restarted_gives_way_to_the_new_one_once_silent(clock):
    seen = telemetry.Telemetry()
    seen.observe(status(10, ProcessState.RUNNING))
    seen.observe(beat(clock, 10))
    clock.now += 1  # killed (SIGKILL): `gpuyard up` says so and starts it again
    seen.observe(status(10, ProcessState.RESTARTING, restarts=1, exit_code=-9, last_error="killed"))
    clock.now += 1
    seen.observe(status(11, ProcessState.RUNNING, restarts=1))
    seen.observe(beat(clock, 11))
    for _ in range(5):  # until 10's last heartbeat is old enough to call it silent
        clock.now += SERVICE_HEARTBEAT_SECONDS
        seen.observe(beat(clock, 11))
        seen.observe(status(11, ProcessState.RUNNING, restarts=1))
    assert [r.state.value for r in seen.service_list(clock.now) if r.pid == 10] == ["silent"]
    assert listed(seen, clock) == {11: "running"}  # silent, and replaced: not listed


def test_an_instance_restarted_without_a_supervisor_gives_way_to_one_started_after_it_went_quiet(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(clock, 10, started=T0 - 3600))
    clock.now += 3  # killed; systemd starts the service again a few seconds later
    seen.observe(beat(clock, 11))
    clock.now += SILENT
    seen.observe(beat(clock, 11))
    assert listed(seen, clock) == {11: "running"}
    assert [r.pid for r in seen.service_list(clock.now)] == [10, 11]


def test_a_sibling_does_not_take_a_silent_instances_place(clock):
    """Two executor processes of one host: one stuck is still said silent while the other runs."""
    seen = telemetry.Telemetry()
    seen.observe(status(10, ProcessState.RUNNING, process="executor-1", service="executor"))
    seen.observe(status(11, ProcessState.RUNNING, process="executor-2", service="executor"))
    seen.observe(beat(clock, 10, service="executor"))
    clock.now += 1
    seen.observe(beat(clock, 11, service="executor"))
    clock.now += SILENT
    seen.observe(beat(clock, 11, service="executor"))
    seen.observe(status(10, ProcessState.RUNNING, process="executor-1", service="executor"))
    seen.observe(status(11, ProcessState.RUNNING, process="executor-2", service="executor"))
    assert listed(seen, clock) == {10: "silent", 11: "running"}


def test_without_a_supervisor_an_instance_started_before_the_silence_does_not_replace_it(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(clock, 10, service="executor", started=T0 - 60))
    seen.observe(beat(clock, 11, service="executor", started=T0 - 59))  # its sibling, started with it
    clock.now += SILENT
    seen.observe(beat(clock, 11, service="executor", started=T0 - 59))
    assert listed(seen, clock) == {10: "silent", 11: "running"}


def test_the_route_lists_what_listed_services_says(clock, tmp_path):
    with submit_context(tmp_path) as ctx, TestClient(create_app(ctx)) as api:
        ctx.telemetry.observe(beat(clock, 10))
        ctx.telemetry.observe(beat(clock, 20, service="monitor"))
        clock.now += GONE_AFTER_SECONDS + 1
        ctx.telemetry.observe(beat(clock, 20, service="monitor"))
        answer = api.get("/v1/services", headers={"Authorization": "Bearer tok-vision"})
        assert answer.status_code == 200
        assert [(row["service"], row["pid"], row["state"]) for row in answer.json()] == [
            ("monitor", 20, "running")
        ]
