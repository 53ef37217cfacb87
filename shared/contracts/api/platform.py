"""The platform's own services and its dead letters as the API shows them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.events.services import ProcessState


class ServiceState(StrEnum):
    """How a service process is: what its supervisor (`gpuyard up`) says of it, else what its heartbeats say."""

    RUNNING = ProcessState.RUNNING.value
    RESTARTING = ProcessState.RESTARTING.value
    CRASH_LOOPING = ProcessState.CRASH_LOOPING.value
    REFUSED = ProcessState.REFUSED.value
    SILENT = "silent"
    """No heartbeat for three of its intervals, and no supervisor says why: it may be gone, or stuck."""


class ServiceOut(Out):
    service: str
    instance: str
    host: str
    pid: int
    version: str
    last_seen_seconds_ago: float = Field(
        description="Since its last heartbeat; for a process that never sent one, since its supervisor's last "
        "word about it."
    )
    state: ServiceState = Field(
        ServiceState.RUNNING,
        description="running; restarting (it exited and is started again), crash_looping (it exited again and "
        "again within a minute of starting: see last_error) or refused (its configuration), as its supervisor "
        "says of it and the processes it was before; silent: no heartbeat for a while, and no supervisor says "
        "why.",
    )
    restarts: int = Field(0, description="How many times its supervisor has started it again.")
    exit_code: int | None = Field(
        None,
        description="How its last exit ended, when it is not running: its exit status, or minus a signal.",
    )
    last_error: str | None = Field(
        None, description="The last line it wrote before that exit, when it is not running; null when none."
    )
    metrics: str | None = Field(
        None,
        description="The URL of its Prometheus /metrics, as its heartbeat says (e.g. "
        "http://10.0.0.7:9410/metrics); null where it serves none.",
    )


class DeadLetterOut(Out):
    seq: int
    consumer: str
    original_subject: str
    error: str
    deliveries: int | None = None
    event: dict[str, Any] | str
