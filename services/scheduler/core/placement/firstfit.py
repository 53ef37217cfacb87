"""First fit: the first node (in inventory order) with room, the first GPUs on it with room. The FIFO baseline."""

from __future__ import annotations

import numpy as np

from gpuyard.services.scheduler.core.demand import Demand
from gpuyard.services.scheduler.core.index import CapacityIndex
from gpuyard.services.scheduler.core.placement.base import Choice, PlacementPolicy, first_slots
from gpuyard.shared.policies import Policy


class FirstFit(PlacementPolicy):
    name = Policy.FIRSTFIT

    def choose(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> Choice:
        i = int(candidates[0])
        return i, first_slots(index, i, demand)
