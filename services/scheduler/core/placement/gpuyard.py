"""GPUYard's own placement policy: FGD's fragmentation score, plus GPU-model scarcity, plus packing.

score(node, GPU) =  FGD's integer score (int(100 * sigmoid(-fragmentation growth / 1000)), see `fgd`)
                 -  MODEL_PRESSURE_WEIGHT * pressure(node's GPU model) * GPUs requested
                 -  (0.35 * CPUs left / largest node's CPUs + 0.65 * milli-GPUs left / largest node's milli-GPUs)
highest wins; ties go to the first node in inventory order.

- Model pressure: how much of the expected demand (the popularity-weighted task shapes, as for FGD) can ONLY
  run on that GPU model, relative to the model's share of the cluster. A job that may run anywhere is steered
  away from models that constrained jobs need (on the openb gpuspec33 trace this halves FGD's unallocated
  GPUs). Zero when no shape is constrained.
- Packing (a best-fit term below one score point, so it mostly orders FGD's many ties): fill the node that
  is left with the least, GPUs weighted above CPUs. Tuned on the openb traces (see docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from services.scheduler.core.demand import Demand
from services.scheduler.core.fragmentation import Fragmenter
from services.scheduler.core.index import CapacityIndex
from services.scheduler.core.placement.base import Choice, PlacementPolicy
from services.scheduler.core.placement.bestfit import largest_node
from services.scheduler.core.placement.fgd import fgd_scores, option_slots

MODEL_PRESSURE_WEIGHT = 30.0
CPU_SHARE_OF_PACKING = 0.35


def model_pressure(index: CapacityIndex, fragmenter: Fragmenter) -> np.ndarray:
    """Per GPU-model id: constrained demand that only that model can serve / the model's share of capacity.

    Index -1 (no GPUs) and -2 (mixed node) read the last two entries, which are 0."""
    key = ("pressure", id(fragmenter))
    found = index.memo.get(key)
    if found is not None:
        return found
    n_models = len(index.states.model_names)
    capacity = np.zeros(n_models + 2)
    for models, ok in zip(index.gpu_models, index.schedulable, strict=True):
        if ok:
            for m in models:
                capacity[m] += 1
    demand = np.zeros(n_models + 2)
    for shape, weight in zip(fragmenter.shapes, fragmenter.weights, strict=True):
        if not shape.count or not shape.models:
            continue
        ids = [m for m in (index.states.model_id(name) for name in shape.models) if m < n_models]
        room = sum(capacity[m] for m in ids)
        for m in ids if room > 0 else ():
            demand[m] += weight * shape.count * shape.milli / 1000 * capacity[m] / room
    pressure = np.where(capacity > 0, demand / np.maximum(capacity, 1) * capacity.sum(), 0.0)
    index.memo[key] = pressure
    return pressure


class GpuYard(PlacementPolicy):
    name = "gpuyard"
    needs_popularity = True

    def choose(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> Choice:
        delta = self.fragmenter.deltas(index.state[candidates], index.cpu_free[candidates], demand)
        score = fgd_scores(delta).astype(np.float64)
        if demand.count:
            pressure = model_pressure(index, self.fragmenter)[index.node_model[candidates]]
            score -= (MODEL_PRESSURE_WEIGHT * demand.total_milli / 1000) * pressure[:, None]
        max_cpu, max_gpu = largest_node(index)
        gpu_left = index.states.total_free[index.state[candidates]] - demand.total_milli
        cpu_left = index.cpu_free[candidates] - demand.cpus
        packing = CPU_SHARE_OF_PACKING * cpu_left / max_cpu + (1 - CPU_SHARE_OF_PACKING) * gpu_left / max_gpu
        score -= packing[:, None]
        best = score.max(axis=1)
        row = int(np.argmax(best))
        i = int(candidates[row])
        return i, option_slots(index, i, score[row] == best[row], demand)
