"""Alerts (raised, resolved) and idle reclaim (warning, stop)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from gpuyard.shared.contracts.events.envelope import EventData, event
from gpuyard.shared.contracts.events.subjects import Subject


class AlertSeverity(StrEnum):
    """How urgent an alert is; each rule has its default, which the rules file may change."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class AlertKind(StrEnum):
    """What raised an alert: one of the monitor's rules (the rules file names each by its kind), the monitor's
    idle-GPU reclaim (`job_idle`) or the executor's GPU slice guard (`gpu_memory_over_slice`)."""

    GPU_IDLE = "gpu_idle"
    GPU_TEMPERATURE = "gpu_temperature"
    GPU_POWER = "gpu_power"
    GPU_XID = "gpu_xid"
    JOB_XID = "job_xid"
    GPU_ECC = "gpu_ecc"
    GPU_LOST = "gpu_lost"
    NODE_LOST = "node_lost"
    JOB_WAITING = "job_waiting"
    JOB_SILENT = "job_silent"
    JOB_IDLE = "job_idle"
    GPU_MEMORY_OVER_SLICE = "gpu_memory_over_slice"


@event(Subject.ALERT_RAISED)
class AlertRaised(EventData):
    """A condition that needs someone's attention began (after its rule's `for` time). `alert_id` names the
    rule and its subject (e.g. `gpu_idle/node-1/2`): one alert is active per id at a time, until its
    `alert.resolved`."""

    alert_id: str
    kind: AlertKind = Field(..., description="The rule or the check that raised it.")
    severity: AlertSeverity = AlertSeverity.WARNING
    message: str = Field(..., description="What happened, in plain words.")
    node: str | None = None
    gpu_index: int | None = None
    job_id: str | None = None
    tenant: str | None = Field(None, description="The tenant of the job it is about: who may see it.")
    user: str | None = None
    value: float | None = Field(None, description="The figure that raised it (°C, W, %, minutes…).")
    threshold: float | None = Field(None, description="The rule's threshold that figure crossed.")

    def entity(self) -> str | None:
        return self.alert_id


@event(Subject.ALERT_RESOLVED)
class AlertResolved(EventData):
    alert_id: str
    kind: AlertKind
    message: str = ""
    tenant: str | None = Field(None, description="As in its `alert.raised`.")

    def entity(self) -> str | None:
        return self.alert_id


class _IdleEvent(EventData):
    job_id: str
    attempt: int = Field(..., ge=1, description="The attempt that leaves its GPUs idle.")
    tenant: str = Field(..., description="The job's tenant.")
    user: str = ""
    threshold_pct: float = Field(..., description="The idle threshold: GPU utilization under it is idle.")
    window_seconds: float = Field(..., description="The job's idle timeout: the window every sample was in.")
    max_utilization_pct: float = Field(
        ..., description="The highest utilization of any of the job's GPUs in that window."
    )
    message: str = Field(..., description="The same, in plain words.")


@event(Subject.IDLE_WARNING)
class IdleWarning(_IdleEvent):
    """A running job's GPUs stayed under the idle threshold in every sample for its idle timeout (after its
    start-up allowance): it is stopped after `grace_seconds` unless they get busy. Recorded and published by
    the monitor that evaluates the alert rules, which also raises a `job_idle` alert; the executor writes a
    line into the job's output (docs/monitor.md, Idle-GPU reclaim)."""

    grace_seconds: float = Field(
        ..., description="How long the job has to use its GPUs before it is stopped."
    )
    stop_at: datetime = Field(..., description="When it is stopped unless its GPUs get busy.")


@event(Subject.IDLE_STOP)
class IdleStop(_IdleEvent):
    """A warned job's GPUs stayed idle through its grace: the executor stops it as it stops a preempted job
    (SIGTERM, `GPUYARD_GRACE_SECONDS` to checkpoint, SIGKILL) and it ends `failed` with the reason `idle`
    and this message, never retried; its GPUs go back to the queue."""

    idle_seconds: float = Field(..., description="How long its GPUs had been idle when it was stopped.")
