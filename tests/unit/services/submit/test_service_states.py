"""`GET /v1/services`'s states, from heartbeats and what the supervisor says (`service.status`): a process
that keeps crashing is crash-looping even while the heartbeats of the processes it was are fresh, and is
listed even if it never sent one; without a supervisor's word, heartbeats say running or silent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuyard.services.submit import telemetry
from gpuyard.shared.contracts.api.platform import ServiceState
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.services import (
    SERVICE_HEARTBEAT_SECONDS,
    ProcessState,
    ServiceHeartbeat,
    ServiceStatus,
)

T0 = 1_800_000_000.0
STALE = 3 * SERVICE_HEARTBEAT_SECONDS + 6  # three intervals missed, and more


class Clock:
    def __init__(self, monkeypatch):
        self.now = T0
        monkeypatch.setattr(telemetry.time, "time", lambda: self.now)


@pytest.fixture
def clock(monkeypatch):
    return Clock(monkeypatch)


def beat(pid: int, service: str = "scheduler", host: str = "h"):
    data = ServiceHeartbeat(
        service=service,
        instance=f"{host}-{pid}",
        pid=pid,
        host=host,
        started_at=datetime.now(UTC),
        version="1.0",
    )
    return make_event(data, source="/test")


def status(pid: int, state: ProcessState, restarts: int = 0, host: str = "h", **more):
    data = ServiceStatus(
        service="scheduler",
        process="scheduler",
        host=host,
        pid=pid,
        state=state,
        restarts=restarts,
        version="1.0",
        **more,
    )
    return make_event(data, source="/gpuyard/supervisor/h")


def by_pid(seen: telemetry.Telemetry) -> dict[int, dict]:
    return {s.pid: s.model_dump(mode="json") for s in seen.service_list()}


def test_heartbeats_alone_say_running_then_silent_once_they_stop(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(10))
    [row] = seen.service_list()
    assert (row.state, row.restarts, row.exit_code, row.last_error) == (ServiceState.RUNNING, 0, None, None)
    clock.now += STALE
    assert [r.state for r in seen.service_list()] == [ServiceState.SILENT]


def test_a_crash_loop_shows_on_the_process_whose_heartbeat_is_still_fresh_and_on_its_successor(clock):
    seen = telemetry.Telemetry()
    seen.observe(status(10, ProcessState.RUNNING))
    seen.observe(beat(10))
    words = "ERROR gpuyard.service: scheduler cannot start: the event store cannot be reached"
    looping = {"exit_code": 1, "last_error": words}
    clock.now += 2
    seen.observe(status(10, ProcessState.CRASH_LOOPING, 3, **looping))  # 10 exited: 2 s since its heartbeat
    rows = by_pid(seen)
    assert rows[10]["state"] == "crash_looping" and rows[10]["last_seen_seconds_ago"] == 2
    assert (rows[10]["restarts"], rows[10]["exit_code"], rows[10]["last_error"]) == (3, 1, words)

    clock.now += 4
    seen.observe(status(11, ProcessState.CRASH_LOOPING, 3, **looping))  # started again, no heartbeat yet
    rows = by_pid(seen)
    assert set(rows) == {10, 11}
    assert rows[10]["state"] == rows[11]["state"] == "crash_looping"
    assert rows[11]["instance"] == "h-11" and rows[11]["last_error"] == words
    assert rows[11]["last_seen_seconds_ago"] == 0

    seen.observe(beat(11))  # it heartbeats: one row for it, still crash-looping
    assert [r.pid for r in seen.service_list()] == [10, 11]
    assert by_pid(seen)[11]["state"] == "crash_looping"


def test_stable_again_it_runs_with_its_restarts_and_no_error_and_the_old_process_goes_silent(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(10))
    seen.observe(status(10, ProcessState.RESTARTING, 1, exit_code=-9, last_error="killed"))
    seen.observe(status(11, ProcessState.RESTARTING, 1, exit_code=-9, last_error="killed"))
    seen.observe(beat(11))
    assert by_pid(seen)[11]["state"] == "restarting"
    for _ in range(12):  # a minute: heartbeats every 5 s, the supervisor's word too
        clock.now += SERVICE_HEARTBEAT_SECONDS
        seen.observe(beat(11))
        seen.observe(status(11, ProcessState.RESTARTING, 1, exit_code=-9, last_error="killed"))
    seen.observe(status(11, ProcessState.RUNNING, 1))
    rows = by_pid(seen)
    assert rows[11] | {"last_seen_seconds_ago": 0} == {
        "service": "scheduler",
        "instance": "h-11",
        "host": "h",
        "pid": 11,
        "version": "1.0",
        "last_seen_seconds_ago": 0,
        "state": "running",
        "restarts": 1,
        "exit_code": None,
        "last_error": None,
        "metrics": None,
    }
    assert rows[10]["state"] == "silent"


def test_a_supervisors_word_no_longer_counts_once_it_stopped_saying_it(clock):
    seen = telemetry.Telemetry()
    seen.observe(beat(10))
    seen.observe(status(10, ProcessState.CRASH_LOOPING, 3, exit_code=1, last_error="boom"))
    seen.observe(status(11, ProcessState.CRASH_LOOPING, 3, exit_code=1, last_error="boom"))
    assert [r.state for r in seen.service_list()] == [ServiceState.CRASH_LOOPING] * 2
    clock.now += STALE  # neither a heartbeat nor the supervisor's word since
    [row] = seen.service_list()
    assert row.pid == 10 and row.state == ServiceState.SILENT and row.last_error is None


def test_a_status_applies_to_its_own_host_only():
    seen = telemetry.Telemetry()
    seen.observe(beat(10, host="other"))
    seen.observe(status(10, ProcessState.CRASH_LOOPING, 3, exit_code=1, last_error="boom"))
    rows = {(r.host, r.pid): r.state for r in seen.service_list()}
    assert rows == {("other", 10): ServiceState.RUNNING, ("h", 10): ServiceState.CRASH_LOOPING}


def test_a_running_process_that_never_sent_a_heartbeat_is_not_listed_from_the_status_alone():
    seen = telemetry.Telemetry()
    seen.observe(status(10, ProcessState.RUNNING))  # just started: its heartbeat will list it
    assert seen.service_list() == []


def test_processes_no_status_names_and_no_heartbeat_lists_are_forgotten(clock):
    seen = telemetry.Telemetry()
    seen.observe(status(10, ProcessState.RESTARTING, 1, exit_code=1, last_error="x"))
    for pid in range(11, 20):  # started again and again, never heartbeating
        seen.observe(status(pid, ProcessState.CRASH_LOOPING, pid - 10, exit_code=1, last_error="x"))
    clock.now += 61
    seen.observe(beat(30, service="submit"))  # (pruning comes with what is heard)
    assert set(seen.supervised) == {("h", 19)}
