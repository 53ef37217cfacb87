"""Turning trace tables into the core's inputs: a capacity index for nodes, demands and shapes for pods."""

from __future__ import annotations

import numpy as np

from gpuyard.shared.scheduling.demand import MILLI, Demand
from gpuyard.shared.scheduling.fragmentation import TaskShape, shape_of, typical_shapes
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.sim.trace import GPU_MEMORY_GIB, NodeTable, PodTable


def node_index(nodes: NodeTable) -> CapacityIndex:
    return CapacityIndex(
        nodes.names,
        [[m] * int(g) for m, g in zip(nodes.models, nodes.gpus, strict=True)],
        [[GPU_MEMORY_GIB.get(m, 0) << 30] * int(g) for m, g in zip(nodes.models, nodes.gpus, strict=True)],
        np.nan_to_num(nodes.cpus),
        np.nan_to_num(nodes.memory),
    )


def pod_demands(pods: PodTable) -> tuple[list[Demand], np.ndarray]:
    """One Demand per distinct pod shape, and each pod's index into that list."""
    seen: dict[tuple, int] = {}
    demands: list[Demand] = []
    which = np.empty(len(pods), dtype=np.int64)
    cpus = np.nan_to_num(pods.cpus)
    memory = np.nan_to_num(pods.memory)
    for k in range(len(pods)):
        count = int(pods.num_gpu[k])
        milli = int(pods.gpu_milli[k]) if count else 0
        key = (float(cpus[k]), float(memory[k]), count, milli, pods.gpu_spec[k])
        found = seen.get(key)
        if found is None:
            fraction = 1.0 if milli == MILLI else milli / MILLI
            found = seen[key] = len(demands)
            demands.append(Demand(count, milli, key[0], key[1], 0.0, pods.gpu_spec[k], fraction))
        which[k] = found
    return demands, which


def popularity(pods: PodTable) -> tuple[tuple[TaskShape, float], ...]:
    demands, which = pod_demands(pods)
    return typical_shapes(shape_of(demands[k]) for k in which.tolist())
