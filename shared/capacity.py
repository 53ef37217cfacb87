"""Whether a job could ever be placed on the cluster its nodes' heartbeats describe, were every node empty.

The submit service refuses a job no node could ever hold (as Slurm refuses a request no partition can
satisfy) with this reason, unless `GPUYARD_ACCEPT_UNPLACEABLE` keeps such jobs waiting for a cluster that
grows. The rule is the scheduler's own, `never_fits` in `shared/scheduling/explain.py`, written here over
heartbeats (the submit service has no capacity index); a property test keeps the two answering alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.units import count_text, format_size

EPS = 1e-9
MILLI = 1000


def _share_milli(fraction: float) -> int:
    return min(MILLI, max(1, math.ceil(fraction * MILLI - 1e-6)))


def unplaceable(spec: JobSpec, nodes: Iterable[NodeHeartbeat]) -> str | None:
    """Why no node of `nodes` could ever hold the job's replicas (all at once), or None when some could, or
    when no node is known (nothing can be said yet)."""
    nodes = list(nodes)
    if not nodes:
        return None
    r, replicas = spec.resources, spec.replicas
    models = set(r.gpu_model)
    whole = r.gpus >= 1
    count = math.ceil(r.gpus - 1e-9) if whole else (1 if r.gpus > 0 else 0)
    gpu_memory = r.gpu_memory or 0
    if count and models and not any(g.model in models for n in nodes for g in n.gpus):
        return f"needs GPU model {' or '.join(sorted(models))}; no node has one"
    usable = {
        n.node: sum(1 for g in n.gpus if (not models or g.model in models) and g.memory_bytes >= gpu_memory)
        for n in nodes
    }
    matching = [n for n in nodes if not (count and models) or any(g.model in models for g in n.gpus)]
    if count and whole:
        largest = max(matching, key=lambda n: usable[n.node])
        if usable[largest.node] < count:
            return (
                f"needs {count_text(count, 'GPU')} on one node; the largest node has {usable[largest.node]} "
                f"({largest.node})"
            )
    slots = 0
    for n in matching:
        here = math.floor(n.cpus / r.cpus + EPS) if r.cpus > EPS else replicas
        here = min(here, n.memory_bytes // r.memory) if r.memory > 0 else here
        if count:
            gpus = usable[n.node]
            here = min(here, gpus // count if whole else gpus * (MILLI // _share_milli(r.gpus)))
        slots += max(here, 0)
    if slots == 0:
        most = max(nodes, key=lambda n: (n.cpus, n.memory_bytes))
        return (
            f"needs {count_text(r.cpus, 'CPU')} and {format_size(r.memory)} per replica; the largest node has "
            f"{count_text(most.cpus, 'CPU')} and {format_size(most.memory_bytes)}"
        )
    if slots < replicas:
        return f"needs {replicas} workers at once; the whole cluster holds only {slots} of them"
    return None
