"""The pure scheduling core: (cluster state, queue, config) -> placements, preemptions, reasons.

No I/O here: no NATS, no store, no clock. `schedule` decides one cycle over a snapshot; `Scheduler` holds the
cluster between cycles and is told what changed (the live service); the trace simulator calls `decide` on a
capacity index it keeps. All three run the same decisions.
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
from services.scheduler.core.scheduler import Scheduler

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
    "Scheduler",
    "SchedulerConfig",
    "schedule",
]
