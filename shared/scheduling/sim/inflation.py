"""Workload inflation, the FGD paper's protocol (see traces/README.md beside this module).

The GPU nodes of the node file; pods drawn uniformly at random with replacement from one pod file until the
arrived GPU demand reaches 130% of the cluster's GPU capacity; order shuffled; each pod placed once, in order,
no departures, retries or preemption; a pod that does not fit fails. Figure of merit: unallocated GPUs
(100% - allocated milli-GPU share) as a function of arrived demand, read at 100%; mean over seeds.

Each pod is a one-replica job handed to the SAME placement code the live `schedule` uses (`place_gang` with
the policy from `make_policy`), on a capacity index kept alive across pods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuyard.shared.scheduling.gang import place_gang
from gpuyard.shared.scheduling.placement import make_policy
from gpuyard.shared.scheduling.sim.cluster import node_index, pod_demands, popularity
from gpuyard.shared.scheduling.sim.trace import NodeTable, PodTable

INFLATION = 1.30
GRID = np.arange(0, 131)  # arrived demand, % of capacity, where the curve is read


@dataclass(slots=True)
class InflationRun:
    policy: str
    seed: int
    capacity_milli: int
    pods: int
    failed: int
    unallocated_at: np.ndarray  # % unallocated at each GRID point
    seconds: float = 0.0

    @property
    def at_100(self) -> float:
        return float(self.unallocated_at[100])


@dataclass(slots=True)
class InflationSummary:
    policy: str
    runs: list[InflationRun] = field(default_factory=list)

    @property
    def mean_curve(self) -> np.ndarray:
        return np.mean([r.unallocated_at for r in self.runs], axis=0)

    @property
    def mean_at_100(self) -> float:
        return float(np.mean([r.at_100 for r in self.runs]))

    @property
    def std_at_100(self) -> float:
        return float(np.std([r.at_100 for r in self.runs]))


def draw_workload(pods: PodTable, capacity_milli: int, seed: int, ratio: float = INFLATION) -> np.ndarray:
    """Pod indices drawn with replacement until arrived GPU demand reaches `ratio` of capacity, shuffled."""
    rng = np.random.default_rng(seed)
    demand = pods.gpu_demand_milli
    target = ratio * capacity_milli
    chosen: list[np.ndarray] = []
    total = 0.0
    mean = max(float(demand.mean()), 1.0)
    while total < target:
        batch = rng.integers(0, len(pods), size=int((target - total) / mean) + 64)
        cum = total + np.cumsum(demand[batch])
        stop = int(np.searchsorted(cum, target, side="left"))
        if stop < batch.size:
            chosen.append(batch[: stop + 1])
            total = float(cum[stop])
            break
        chosen.append(batch)
        total = float(cum[-1])
    order = np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)
    return rng.permutation(order)


def run_inflation(
    nodes: NodeTable,
    pods: PodTable,
    policy_name: str,
    seed: int,
    ratio: float = INFLATION,
    progress: Callable[[int], None] | None = None,
) -> InflationRun:
    import time

    started = time.perf_counter()
    index = node_index(nodes)
    policy = make_policy(policy_name, popularity(pods))
    demands, which = pod_demands(pods)
    capacity = nodes.total_gpus * 1000
    order = draw_workload(pods, capacity, seed, ratio)
    pod_demand = pods.gpu_demand_milli
    arrived = np.cumsum(pod_demand[order])
    allocated_after = np.empty(order.size, dtype=np.int64)
    allocated = failed = 0
    for n, k in enumerate(order.tolist()):
        demand = demands[which[k]]
        if place_gang(index, policy, demand, 1) is None:
            failed += 1
        else:
            allocated += demand.total_milli
        allocated_after[n] = allocated
        if progress is not None and (n + 1) % 500 == 0:
            progress(500)
    if progress is not None and order.size % 500:
        progress(order.size % 500)  # the progress adds up to the pods drawn
    # state when arrived demand has reached x% of capacity: after the last pod whose arrival keeps it <= x%
    points = np.searchsorted(arrived, GRID / 100.0 * capacity, side="right") - 1
    allocated_at = np.where(points >= 0, allocated_after[np.clip(points, 0, None)], 0)
    unallocated = 100.0 * (1.0 - allocated_at / capacity)
    return InflationRun(
        policy_name, seed, capacity, int(order.size), failed, unallocated, time.perf_counter() - started
    )
