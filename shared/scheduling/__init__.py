"""The pure scheduling core: (cluster state, queue, config) -> placements, preemptions, reasons.

No I/O here: no NATS, no store, no clock. `decide` is the one entry point to a cycle, on a capacity index:
the live service keeps its cluster in a `HeldCluster` (told what changed) and the trace simulator keeps its own
index; a snapshot (`ClusterState`) becomes an index with `CapacityIndex.from_state`.
"""

from gpuyard.shared.scheduling.cluster import HeldCluster
from gpuyard.shared.scheduling.cycle import decide
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import (
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
from gpuyard.shared.scheduling.queue import HeldQueue, Pending

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
