"""GPU-hours and GPU history as the API shows them."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.api.nodes import GpuHolderOut


class UsageBy(StrEnum):
    TENANT = "tenant"
    USER = "user"
    JOB = "job"


class UsageRowOut(Out):
    tenant: str
    user: str | None = Field(None, description="With by=user or by=job.")
    job_id: str | None = Field(None, description="With by=job.")
    jobs: int = Field(description="Jobs counted in the row.")
    allocated_gpu_hours: float = Field(description="GPU share × time placed or running, in the window.")
    used_gpu_hours: float = Field(description="Allocated GPU time weighted by the GPUs' utilization.")
    waste_gpu_hours: float = Field(description="Allocated − used (at least 0).")


class UsageOut(Out):
    since: datetime
    until: datetime
    by: UsageBy
    rows: list[UsageRowOut]


class GpuPointOut(Out):
    """One GPU over `seconds` from `t`: its figures are means over them."""

    node: str
    gpu: int
    t: datetime
    seconds: float
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int = 0
    holders: list[GpuHolderOut] = Field(default_factory=list)


class GpuHistoryOut(Out):
    node: str
    since: datetime
    until: datetime
    step_seconds: float = Field(description="Seconds each point stands for (at least the stored resolution).")
    points: list[GpuPointOut]


class JobGpuOut(Out):
    job_id: str
    allocated_gpu_hours: float
    used_gpu_hours: float
    mean_utilization_pct: float | None = Field(
        None,
        description="Mean utilization of its GPUs over its run, from the GPU history (None: no samples).",
    )
    peak_memory_used_bytes: int | None = None
    step_seconds: float
    points: list[GpuPointOut] = Field(
        description="Its GPUs over its run (the history keeps 7 days by default)."
    )
