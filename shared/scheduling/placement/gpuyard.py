"""GPUYard's own placement policy: FGD's fragmentation plus CPU stranding, GPU-model scarcity and packing.

growth(node, option) = FGD's fragmentation growth (milli-GPU, see `core.fragmentation`)
                     + growth of the node's CPU-stranded GPU capacity (milli-GPU, see below)
score(node, option)  = int(100 * sigmoid(-growth / 1000))              (FGD's integer score, see `fgd`)
                     - MODEL_PRESSURE_WEIGHT * pressure(node's GPU model) * GPUs requested
                     - (0.35 * CPUs left / largest node's CPUs + 0.65 * milli-GPUs left / largest node's milli-GPUs)
highest wins; ties go to the first node in inventory order.

- CPU stranding: FGD asks, shape by shape, whether ONE more task of the shape would still fit the node's free
  CPUs; it does not see that the node's free CPUs may be too few for ALL of its free GPUs. The typical task
  asks for c CPUs per GPU (popularity-weighted over the GPU shapes, `Fragmenter.cpus_per_gpu`; about 11 on the
  openb traces), so free CPUs C feed at most 1000 * C / c milli-GPU and the rest of the free GPU capacity F is
  stranded: max(0, F - 1000 * C / c). Its growth is added to FGD's growth (same unit): CPU-heavy tasks avoid
  nodes whose CPUs are already short for their GPUs, and tasks with few CPUs per GPU are drawn to CPU-poor
  nodes (P100 and V100 nodes have 8 CPUs per GPU), whose GPUs the typical task could not use. On a GPU model
  that constrained jobs need (model pressure > 0) only growth counts, not a decrease: otherwise flexible
  low-CPU tasks would be pulled onto the models the constrained jobs need. On the openb traces this removes
  0.4-0.8 points of unallocated GPUs (see docs/benchmarks.md).
- Model pressure: how much of the expected demand (the popularity-weighted task shapes, as for FGD) can ONLY
  run on that GPU model, relative to the model's share of the cluster. A job that may run anywhere is steered
  away from models that constrained jobs need (on the openb gpuspec33 trace this halves FGD's unallocated
  GPUs). Zero when no shape is constrained.
- Packing (a best-fit term below one score point, so it mostly orders FGD's many ties): fill the node that
  is left with the least, GPUs weighted above CPUs.

Every term depends on a node only through its GPU state and free CPUs, so scores are cached per (state, free
CPUs) by `ScoringPolicy.best`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.scheduling.demand import MILLI, Demand
from gpuyard.shared.scheduling.fragmentation import Fragmenter
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.placement.base import ScoringPolicy
from gpuyard.shared.scheduling.placement.bestfit import largest_node
from gpuyard.shared.scheduling.placement.fgd import fgd_scores, option_slots

MODEL_PRESSURE_WEIGHT = 30.0
CPU_SHARE_OF_PACKING = 0.35


def model_pressure(index: CapacityIndex, fragmenter: Fragmenter) -> np.ndarray:
    """Per GPU-model id: constrained demand that only that model can serve / the model's share of capacity.

    Index -1 (no GPUs) and -2 (mixed node) read the last two entries, which are 0."""
    found = index.memo.get("pressure")
    if found is not None and found[0] is fragmenter:
        return found[1]
    n_models = len(index.states.model_names)
    capacity = np.zeros(n_models + 2)
    rows: dict[int, list[int]] = {}  # alike nodes share one row of model ids: count rows, then their GPUs
    per_row: Counter = Counter()
    for models, ok in zip(index.gpu_models, index.schedulable.tolist(), strict=True):
        if ok:
            rows[id(models)] = models
            per_row[id(models)] += 1
    for row, n in per_row.items():
        for m in rows[row]:
            capacity[m] += n
    demand = np.zeros(n_models + 2)
    for shape, weight in zip(fragmenter.shapes, fragmenter.weights, strict=True):
        if not shape.count or not shape.models:
            continue
        ids = [m for m in (index.states.model_id(name) for name in shape.models) if m < n_models]
        room = sum(capacity[m] for m in ids)
        for m in ids if room > 0 else ():
            demand[m] += weight * shape.count * shape.milli / 1000 * capacity[m] / room
    pressure = np.where(capacity > 0, demand / np.maximum(capacity, 1) * capacity.sum(), 0.0)
    index.memo["pressure"] = (fragmenter, pressure)  # the last shape distribution's (a held index sees many)
    return pressure


def stranded(free_milli: np.ndarray, cpu_free: np.ndarray, cpus_per_gpu: float) -> np.ndarray:
    """Free GPU capacity (milli-GPU) that the node's free CPUs cannot feed at the typical CPUs per GPU."""
    return np.maximum(0.0, free_milli - MILLI * np.maximum(cpu_free, 0.0) / cpus_per_gpu)


class GpuYard(ScoringPolicy):
    name = Policy.GPUYARD
    needs_popularity = True
    fragmenter: Fragmenter  # (`make_policy` gives one to a policy that needs the shape distribution)

    def scores(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> np.ndarray:
        sids, cpu_free = index.state[candidates], index.cpu_free[candidates]
        delta = self.fragmenter.deltas(sids, cpu_free, demand)
        pressure = model_pressure(index, self.fragmenter)[index.node_model[candidates]]
        per_gpu = self.fragmenter.cpus_per_gpu
        if per_gpu > 0:
            free = index.states.total_free[sids].astype(np.float64)
            before = stranded(free, cpu_free, per_gpu)
            after = stranded(free - demand.total_milli, cpu_free - demand.cpus, per_gpu)
            growth = after - before
            # un-stranding GPUs is a gain only where no constrained job needs the model (see the docstring)
            growth = np.where(pressure > 0, np.maximum(growth, 0.0), growth)
            delta = delta + growth[:, None]
        score = fgd_scores(delta).astype(np.float64)
        if demand.count:
            score -= (MODEL_PRESSURE_WEIGHT * demand.total_milli / 1000) * pressure[:, None]
        max_cpu, max_gpu = largest_node(index)
        gpu_left = index.states.total_free[index.state[candidates]] - demand.total_milli
        cpu_left = index.cpu_free[candidates] - demand.cpus
        packing = CPU_SHARE_OF_PACKING * cpu_left / max_cpu + (1 - CPU_SHARE_OF_PACKING) * gpu_left / max_gpu
        score -= packing[:, None]
        return score

    def slots(self, index: CapacityIndex, i: int, demand: Demand, options: np.ndarray) -> list[int]:
        return option_slots(index, i, options, demand)
