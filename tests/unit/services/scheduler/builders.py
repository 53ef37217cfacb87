"""Tiny builders for scheduler tests: a cluster in one line, jobs with only the fields that matter."""

from __future__ import annotations

from gpuyard.shared.scheduling import (
    Allocation,
    CapacityIndex,
    ClusterState,
    CycleResult,
    Gpu,
    GpuAssignment,
    HeldCluster,
    JobRequest,
    Node,
    ReplicaAssignment,
    SchedulerConfig,
    decide,
)
from gpuyard.shared.scheduling.cluster import allocate

GIB = 1 << 30


def node(
    name: str,
    gpus: int = 8,
    model: str = "A100",
    cpus: float = 64,
    memory: int = 512 * GIB,
    gpu_memory: int = 80 * GIB,
) -> Node:
    return Node(name, [Gpu(i, model, gpu_memory, uuid=f"{name}-{i}") for i in range(gpus)], cpus, memory)


def cluster(
    *nodes: Node,
    running: list[Allocation] | None = None,
    quotas: dict[str, float] | None = None,
    now: float = 10_000.0,
) -> ClusterState:
    """A cluster with the running jobs' allocations applied to its nodes."""
    state = ClusterState({n.name: n for n in nodes}, list(running or []), dict(quotas or {}), now)
    for alloc in state.running:
        for r in alloc.replicas:
            n = state.nodes[r.node]
            n.allocated_cpus += r.cpus
            n.allocated_memory += r.memory
            for g in r.gpus:
                gpu = n.gpus[g.index]
                gpu.allocated += g.fraction
                gpu.allocated_memory += g.memory or 0
    return state


def job(job_id: str, gpus: float = 1, tenant: str = "t", **kw) -> JobRequest:
    kw.setdefault("submitted_at", float(sum(ord(c) for c in job_id)))
    return JobRequest(job_id, tenant, gpus=gpus, **kw)


def running(
    j: JobRequest,
    node_name: str,
    gpu_indices: list[int],
    started_at: float = 0.0,
    fraction: float | None = None,
    memory: int | None = None,
) -> Allocation:
    """`j` running with one replica on `node_name`'s GPUs `gpu_indices`."""
    frac = fraction if fraction is not None else (1.0 if j.gpus >= 1 else j.gpus)
    gpus = tuple(GpuAssignment(i, frac, memory) for i in gpu_indices)
    return Allocation(j, (ReplicaAssignment(0, node_name, gpus, j.cpus, j.memory),), started_at)


def where(result, job_id: str) -> list[tuple[str, tuple[int, ...]]]:
    p = next(p for p in result.placements if p.job_id == job_id)
    return [(r.node, tuple(g.index for g in r.gpus)) for r in p.replicas]


def decide_snapshot(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig | None = None
) -> CycleResult:
    """`decide` on a snapshot (its index built from `state`); the state's nodes then hold the placements, so a
    test that keeps the state sees what was decided."""
    index = CapacityIndex.from_state(state)
    result = decide(index, state.running, queue, config or SchedulerConfig(), state.quotas, state.now)
    for placement in result.placements:
        for r in placement.replicas:
            allocate(state.nodes[r.node], (r,))
    return result


def decide_held(
    held: HeldCluster,
    queue: list[JobRequest],
    now: float,
    quotas: dict[str, float] | None = None,
    config: SchedulerConfig | None = None,
) -> CycleResult:
    """`decide` on a held cluster, as the live service runs it."""
    index = held.index()
    result = decide(index, held.allocations(), queue, config or SchedulerConfig(), quotas, now, held.kinds)
    held.decided(result)
    return result
