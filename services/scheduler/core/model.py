"""Plain data of the scheduling core. Slotted dataclasses: the core must place thousands of jobs a second."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EPS = 1e-9


@dataclass(slots=True)
class Gpu:
    index: int
    model: str
    memory: int  # bytes
    uuid: str = ""
    allocated: float = 0.0  # share of the GPU in use, 0..1
    allocated_memory: int = 0  # bytes of memory slices handed out

    @property
    def free(self) -> float:
        return max(0.0, 1.0 - self.allocated)

    @property
    def free_memory(self) -> int:
        return self.memory - self.allocated_memory

    @property
    def idle(self) -> bool:
        return self.allocated <= EPS


@dataclass(slots=True)
class Node:
    name: str
    gpus: list[Gpu]
    cpus: float
    memory: int
    allocated_cpus: float = 0.0
    allocated_memory: int = 0
    schedulable: bool = True

    @property
    def free_cpus(self) -> float:
        return self.cpus - self.allocated_cpus

    @property
    def free_memory(self) -> int:
        return self.memory - self.allocated_memory

    @property
    def idle_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.idle)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A waiting (or running) job as the core sees it. Resources are per replica."""

    job_id: str
    tenant: str
    gpus: float = 0.0  # whole number >= 1, or a fraction 0 < g < 1, per replica
    replicas: int = 1
    cpus: float = 0.0
    memory: int = 0
    gpu_memory: int | None = None  # memory slice of a fractional GPU, or least memory per whole GPU
    gpu_models: tuple[str, ...] = ()
    priority: int = 50
    user: str = ""
    submitted_at: float = 0.0  # seconds, on the caller's clock
    timeout: float | None = None  # seconds an attempt may run (for start estimates)
    not_before: float | None = None  # retry backoff: not placeable before this time

    @property
    def total_gpus(self) -> float:
        return self.gpus * self.replicas


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    index: int
    fraction: float = 1.0
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    replica: int
    node: str
    gpus: tuple[GpuAssignment, ...]
    cpus: float = 0.0
    memory: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    replicas: tuple[ReplicaAssignment, ...]


@dataclass(frozen=True, slots=True)
class Allocation:
    """A job that holds resources now (placed or running)."""

    job: JobRequest
    replicas: tuple[ReplicaAssignment, ...]
    started_at: float = 0.0
    borrowed: bool = False  # admitted on another tenant's idle quota


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a job waits. `code` is for machines, `message` (with numbers) for people, `details` the numbers."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    position: int | None = None
    estimated_start: float | None = None  # on the caller's clock; None when it cannot be known


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    reason: str
    by_job: str | None = None


@dataclass(slots=True)
class ClusterState:
    """Inventory with the current allocations already applied to the nodes' GPUs."""

    nodes: dict[str, Node]
    running: list[Allocation] = field(default_factory=list)
    quotas: dict[str, float] = field(default_factory=dict)  # tenant -> guaranteed GPUs
    now: float = 0.0


@dataclass(slots=True)
class SchedulerConfig:
    policy: str = "firstfit"


@dataclass(slots=True)
class CycleResult:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    pending: dict[str, Reason] = field(default_factory=dict)
