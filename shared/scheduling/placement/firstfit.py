"""First fit: the first node (in inventory order) with room, the first GPUs on it with room. The FIFO baseline."""

from __future__ import annotations

import numpy as np

from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.placement.base import Choice, PlacementPolicy, first_slots


class FirstFit(PlacementPolicy):
    name = Policy.FIRSTFIT

    def choose(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> Choice:
        i = int(candidates[0])
        return i, first_slots(index, i, demand)
