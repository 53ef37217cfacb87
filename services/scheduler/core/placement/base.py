"""What every placement policy shares: the interface and the ways to pick GPUs inside the chosen node."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from services.scheduler.core.demand import Demand
from services.scheduler.core.fragmentation import Fragmenter
from services.scheduler.core.index import CapacityIndex

Choice = tuple[int, list[int]]  # (node position, GPU slots on that node)


class PlacementPolicy(ABC):
    """Chooses the node (and the GPUs on it) for ONE replica among nodes where it fits.

    `choose` gets the candidate node positions in node order (never empty) and must be deterministic: ties go
    to the lowest node position. A policy that needs the shape distribution gets a `Fragmenter`.
    """

    name = ""
    needs_popularity = False

    def __init__(self, fragmenter: Fragmenter | None = None) -> None:
        self.fragmenter = fragmenter

    @abstractmethod
    def choose(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> Choice:
        """The chosen node and GPU slots; every policy defines it."""


def first_slots(index: CapacityIndex, i: int, demand: Demand) -> list[int]:
    return index.eligible(i, demand)[: demand.count] if demand.count else []


def tightest_slots(index: CapacityIndex, i: int, demand: Demand) -> list[int]:
    """Whole GPUs: the first idle ones. A share: the GPU with the least room that still holds it."""
    if not demand.count:
        return []
    slots = index.eligible(i, demand)
    if demand.whole:
        return slots[: demand.count]
    free = index.free[i]
    return [min(slots, key=lambda s: (free[s], s))]


def slot_with_free(index: CapacityIndex, i: int, demand: Demand, value: int) -> list[int]:
    """A share: the first GPU whose free share is exactly `value` (the option a policy scored), else tightest."""
    free = index.free[i]
    for s in index.eligible(i, demand):
        if free[s] == value:
            return [s]
    return tightest_slots(index, i, demand)
