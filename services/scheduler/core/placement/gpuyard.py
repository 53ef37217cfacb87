"""GPUYard's own placement policy (draft; tuned against FGD in the trace simulator)."""

from __future__ import annotations

import os

import numpy as np

from services.scheduler.core.demand import Demand
from services.scheduler.core.index import CapacityIndex
from services.scheduler.core.placement.base import Choice, PlacementPolicy
from services.scheduler.core.placement.bestfit import leftover_score
from services.scheduler.core.placement.fgd import fgd_scores, option_slots

LAMBDA = float(os.environ.get("GY_LAMBDA", "10"))
TIE = float(os.environ.get("GY_TIE", "1"))
KIND = os.environ.get("GY_KIND", "bestfit")


def model_pressure(index: CapacityIndex, fragmenter) -> np.ndarray:
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
        ids = [index.states.model_id(m) for m in shape.models]
        ids = [m for m in ids if m < n_models]
        room = sum(capacity[m] for m in ids)
        if room <= 0:
            continue
        for m in ids:
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
        if demand.count and LAMBDA:
            pressure = model_pressure(index, self.fragmenter)[index.node_model[candidates]]
            score -= LAMBDA * pressure[:, None] * demand.total_milli / 1000
        if TIE:
            if KIND == "bestfit":
                score -= TIE * leftover_score(index, demand, candidates)[:, None]
            elif KIND == "gpu":
                left = index.states.total_free[index.state[candidates]] - demand.total_milli
                score -= TIE * (left / 8000.0)[:, None]
            elif KIND == "delta":
                score -= TIE * np.where(np.isfinite(delta), delta, 0) / 1000.0
            elif KIND == "cpu":
                score -= TIE * ((index.cpu_free[candidates] - demand.cpus) / 128.0)[:, None]
        best = score.max(axis=1)
        row = int(np.argmax(best))
        i = int(candidates[row])
        return i, option_slots(index, i, score[row] == best[row], demand)
