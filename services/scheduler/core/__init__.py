"""The pure scheduling core: (cluster state, queue, config) -> placements, preemptions, reasons.

No I/O here: no NATS, no store, no clock. `decide` is the one entry point to a cycle, on a capacity index:
the live service keeps its cluster in a `HeldCluster` (told what changed) and the trace simulator keeps its own
index; a snapshot (`ClusterState`) becomes an index with `CapacityIndex.from_state`.
"""

from gpuyard.services.scheduler.core.cluster import HeldCluster
from gpuyard.services.scheduler.core.cycle import decide
from gpuyard.services.scheduler.core.index import CapacityIndex
from gpuyard.services.scheduler.core.model import (
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
from gpuyard.services.scheduler.core.queue import HeldQueue, Pending

__all__ = [
    "Allocation",
    "CapacityIndex",
    "ClusterState",
    "CycleResult",
    "Gpu",
    "GpuAssignment",
    "HeldCluster",
    "HeldQueue",
    "JobRequest",
    "Node",
    "Pending",
    "Placement",
    "Preemption",
    "Reason",
    "ReplicaAssignment",
    "SchedulerConfig",
    "decide",
]
