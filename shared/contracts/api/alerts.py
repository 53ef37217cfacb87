"""Alerts as the API shows them."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.events.alerts import AlertSeverity


class AlertState(StrEnum):
    ACTIVE = "active"
    RESOLVED = "resolved"


class AlertStates(StrEnum):
    """Which alerts `GET /v1/alerts` lists."""

    ACTIVE = "active"
    RESOLVED = "resolved"
    ALL = "all"


class AlertOut(Out):
    """One occurrence of an alert: raised, and resolved once its condition cleared."""

    alert_id: str = Field(description="The rule and its subject, e.g. gpu_temperature/node-1/3.")
    kind: str = Field(description="The rule: gpu_idle, gpu_temperature, gpu_xid, node_lost, job_waiting…")
    severity: AlertSeverity
    state: AlertState
    message: str = Field(description="What happened, in plain words.")
    node: str | None = None
    gpu_index: int | None = None
    job_id: str | None = None
    tenant: str | None = Field(None, description="The tenant of the job it is about (none: admins only).")
    user: str | None = None
    value: float | None = Field(None, description="The figure that raised it (°C, W, %, minutes…).")
    threshold: float | None = Field(None, description="The rule's threshold that figure crossed.")
    raised_at: datetime
    resolved_at: datetime | None = None
    resolved_message: str = Field("", description="Why it was resolved.")


class AlertListOut(Out):
    items: list[AlertOut] = Field(description="Newest first (by when they were raised).")
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page.")
