"""The events of the platform's own service processes: heartbeats and the supervisor's status of each."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from gpuyard.shared.contracts.events.envelope import EventData, event, upcaster
from gpuyard.shared.contracts.events.subjects import Subject

SERVICE_HEARTBEAT_SECONDS = 5.0
"""How often a service process sends its `service.heartbeat`."""


@event(Subject.SERVICE_HEARTBEAT, version=2)
class ServiceHeartbeat(EventData):
    service: str
    instance: str
    pid: int
    host: str
    started_at: datetime
    version: str
    metrics: str | None = Field(
        None,
        description="The URL of the process's Prometheus /metrics, e.g. http://10.0.0.7:9410/metrics; None "
        "where it serves none.",
    )

    def entity(self) -> str | None:
        return self.instance


@upcaster(Subject.SERVICE_HEARTBEAT, from_version=1)
def _service_heartbeat_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 did not say where the process's /metrics is."""
    return {**data, "metrics": None}


class ProcessState(StrEnum):
    """What a supervisor says of a service process it runs (`service.status`)."""

    RUNNING = "running"
    """Started, and not exited since; or run a minute without exiting since its last restart (stable again)."""
    RESTARTING = "restarting"
    """It exited and is being started again (its supervisor waits 1 s, then 2, 4… up to 30 s)."""
    CRASH_LOOPING = "crash_looping"
    """It exited again and again, each time within a minute of starting; it is still started again, later each
    time."""
    REFUSED = "refused"
    """It refused its configuration: starting it again would not help (`gpuyard up` stops)."""


LAST_ERROR_CHARS = 500
"""The most of a process's last words a `service.status` event carries (longer ones are cut, ending in '…')."""


@event(Subject.SERVICE_STATUS)
class ServiceStatus(EventData):
    """What a supervisor (`gpuyard up`) says of a service process it runs, which cannot say it itself once it
    keeps crashing. Sent when the process exits, is started again or runs stable again, and every
    `interval_seconds` for each process (a reader that missed one, or started since, knows it within seconds;
    one not repeated for three intervals is stale: its supervisor is gone). A service calls its instance
    `<host>-<pid>`, so the `service.heartbeat` events of this process are those of this host and pid."""

    service: str = Field(..., description="submit, scheduler, executor, monitor or serving.")
    process: str = Field(
        ..., description="The supervisor's name of the process: the service's, or executor-1, executor-2…"
    )
    host: str
    pid: int = Field(..., description="The process now: the one running, or the one that just exited.")
    state: ProcessState
    restarts: int = Field(0, ge=0, description="How many times the supervisor has started it again.")
    exit_code: int | None = Field(
        None,
        description="How its last exit ended, when it is not running: its exit status, or minus the signal "
        "that killed it.",
    )
    last_error: str | None = Field(
        None,
        max_length=LAST_ERROR_CHARS,
        description="The last line it wrote before that exit (a crash's or a refusal's reason), when it is not "
        "running.",
    )
    version: str = Field(..., description="The GPUYARD version the supervisor runs it from.")
    interval_seconds: float = Field(SERVICE_HEARTBEAT_SECONDS, gt=0)

    def entity(self) -> str | None:
        return f"{self.host}/{self.process}"
