"""Best fit as in the FGD paper's baseline: the node with the least CPU and GPU left after placing the replica.

Score (lower is better) = 0.5 * (free CPUs - request) / largest node's CPUs
                        + 0.5 * (free milli-GPU - request) / largest node's milli-GPU;
inside the node, a share goes to the GPU with the least room that still holds it.
"""

from __future__ import annotations

import numpy as np

from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.scheduling.demand import MILLI, Demand
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.placement.base import ScoringPolicy


def largest_node(index: CapacityIndex) -> tuple[float, float]:
    """(CPUs, milli-GPUs) of the largest node, computed once per index."""
    found = index.memo.get("largest")
    if found is None:
        max_cpu = float(index.cpus.max(initial=0)) or 1.0
        max_gpu = float(max((len(r) for r in index.free), default=0) * MILLI) or 1.0
        found = index.memo["largest"] = (max_cpu, max_gpu)
    return found


def leftover_score(index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> np.ndarray:
    max_cpu, max_gpu = largest_node(index)
    cpu_left = index.cpu_free[candidates] - demand.cpus
    gpu_left = index.states.total_free[index.state[candidates]] - demand.total_milli
    return 0.5 * cpu_left / max_cpu + 0.5 * gpu_left / max_gpu


class BestFit(ScoringPolicy):
    name = Policy.BESTFIT

    def scores(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> np.ndarray:
        return -leftover_score(index, demand, candidates)[:, None]
