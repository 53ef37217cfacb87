"""The pure scheduling core: (cluster state, queue, config) -> placements, preemptions, reasons.

No I/O here: no NATS, no store, no clock. The live scheduler service and the trace simulator call the
same `schedule` function.
"""

from services.scheduler.core.cycle import schedule
from services.scheduler.core.model import (
    Allocation,
    ClusterState,
    CycleResult,
    Gpu,
    GpuAssignment,
    JobRequest,
    Node,
    Placement,
    Preemption,
    Reason,
    ReplicaAssignment,
    SchedulerConfig,
)

__all__ = [
    "Allocation",
    "ClusterState",
    "CycleResult",
    "Gpu",
    "GpuAssignment",
    "JobRequest",
    "Node",
    "Placement",
    "Preemption",
    "Reason",
    "ReplicaAssignment",
    "SchedulerConfig",
    "schedule",
]
