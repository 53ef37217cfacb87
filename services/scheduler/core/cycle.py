"""One scheduling cycle over a snapshot: order the queue, fit each job, record placements and reasons."""

from __future__ import annotations

from services.scheduler.core.model import (
    EPS,
    ClusterState,
    CycleResult,
    GpuAssignment,
    JobRequest,
    Node,
    Placement,
    Reason,
    ReplicaAssignment,
    SchedulerConfig,
)


def queue_order(job: JobRequest) -> tuple:
    return (-job.priority, job.submitted_at, job.job_id)


def schedule(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig | None = None
) -> CycleResult:
    """Place what fits, first fit in priority then arrival order; every job left waiting gets a reason.

    The nodes in `state` are updated in place with each placement, so a caller that keeps the state gets the
    allocations it decided.
    """
    result = CycleResult()
    waiting = 0
    for job in sorted(queue, key=queue_order):
        if job.not_before is not None and job.not_before > state.now:
            waiting += 1
            result.pending[job.job_id] = Reason(
                code="retry_backoff",
                message=f"waiting {job.not_before - state.now:.0f}s before the next attempt (retry backoff)",
                details={"not_before": job.not_before},
                position=waiting,
            )
            continue
        replicas = _fit(state.nodes, job)
        if replicas is None:
            waiting += 1
            result.pending[job.job_id] = _reason(state.nodes, job, waiting)
            continue
        for r in replicas:
            _take(state.nodes[r.node], r)
        result.placements.append(Placement(job.job_id, tuple(replicas)))
    return result


def _gpu_fits(gpu, job: JobRequest) -> bool:
    if job.gpu_models and gpu.model not in job.gpu_models:
        return False
    if job.gpus >= 1:
        return gpu.idle and (job.gpu_memory is None or gpu.memory >= job.gpu_memory)
    memory = job.gpu_memory or 0
    return gpu.free + EPS >= job.gpus and gpu.free_memory >= memory


def _fit_replica(node: Node, job: JobRequest, replica: int) -> ReplicaAssignment | None:
    if not node.schedulable or node.free_cpus + EPS < job.cpus or node.free_memory < job.memory:
        return None
    gpus: list[GpuAssignment] = []
    if job.gpus > 0:
        want = int(job.gpus) if job.gpus >= 1 else 1
        for gpu in node.gpus:
            if _gpu_fits(gpu, job):
                fraction = 1.0 if job.gpus >= 1 else job.gpus
                gpus.append(GpuAssignment(gpu.index, fraction, job.gpu_memory if job.gpus < 1 else None))
                if len(gpus) == want:
                    break
        if len(gpus) < want:
            return None
    return ReplicaAssignment(replica, node.name, tuple(gpus), job.cpus, job.memory)


def _fit(nodes: dict[str, Node], job: JobRequest) -> list[ReplicaAssignment] | None:
    """All replicas or none (gang): take resources tentatively, give them back if the gang does not fit."""
    taken: list[ReplicaAssignment] = []
    for replica in range(job.replicas):
        for node in nodes.values():
            assignment = _fit_replica(node, job, replica)
            if assignment is not None:
                _take(node, assignment)
                taken.append(assignment)
                break
        else:
            for a in taken:
                _give_back(nodes[a.node], a)
            return None
    for a in taken:
        _give_back(nodes[a.node], a)
    return taken


def _take(node: Node, a: ReplicaAssignment, sign: int = 1) -> None:
    node.allocated_cpus += sign * a.cpus
    node.allocated_memory += sign * a.memory
    for g in a.gpus:
        gpu = node.gpus[g.index] if node.gpus[g.index].index == g.index else _by_index(node, g.index)
        gpu.allocated += sign * g.fraction
        gpu.allocated_memory += sign * (g.memory or 0)


def _give_back(node: Node, a: ReplicaAssignment) -> None:
    _take(node, a, -1)


def _by_index(node: Node, index: int):
    return next(g for g in node.gpus if g.index == index)


def _reason(nodes: dict[str, Node], job: JobRequest, position: int) -> Reason:
    if job.gpus == 0:
        return Reason(
            "insufficient_cpu_memory",
            f"needs {job.cpus:g} CPUs and {job.memory / 1e9:.3g} GB per replica; no node has that free",
            {"cpus": job.cpus, "memory": job.memory},
            position,
        )
    matching = [
        n for n in nodes.values() if any(not job.gpu_models or g.model in job.gpu_models for g in n.gpus)
    ]
    if not matching:
        return Reason(
            "no_matching_gpu_model",
            f"needs GPU model {' or '.join(job.gpu_models)}; no node has one",
            {"gpu_models": list(job.gpu_models)},
            position,
        )
    if job.gpus >= 1:
        best = max(matching, key=lambda n: (sum(1 for g in n.gpus if _gpu_fits(g, job)), n.name))
        largest = sum(1 for g in best.gpus if _gpu_fits(g, job))
        per = int(job.gpus)
        if job.replicas == 1:
            message = f"needs {per} GPUs on one node; the largest free block is {largest} ({best.name})"
        else:
            message = f"needs {job.replicas} workers × {per} GPUs placed together; they do not all fit now"
        return Reason(
            "insufficient_gpus",
            message,
            {"needed_per_replica": per, "replicas": job.replicas, "largest_free": largest, "node": best.name},
            position,
        )
    best_free = max((g.free for n in matching for g in n.gpus), default=0.0)
    return Reason(
        "insufficient_gpu_share",
        f"needs {job.gpus:g} of a GPU; the largest free share is {best_free:.2f}",
        {"needed": job.gpus, "largest_free_share": best_free},
        position,
    )
