"""What every placement policy shares: the interface, the cached scoring and the ways to pick GPUs in a node."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.fragmentation import Fragmenter
from gpuyard.shared.scheduling.index import CapacityIndex

Choice = tuple[int, list[int]]  # (node position, GPU slots on that node)

SMALL = 64  # up to this many candidates, scores come from the per-(state, CPUs) cache one by one
CACHE_LIMIT = 200_000  # entries per demand before the cache starts over


class PlacementPolicy(ABC):
    """Chooses the node (and the GPUs on it) for ONE replica among nodes where it fits.

    `choose` gets the candidate node positions in node order (never empty) and must be deterministic: ties go
    to the lowest node position. A policy that needs the shape distribution gets a `Fragmenter`.
    """

    name: Policy
    needs_popularity = False

    def __init__(self, fragmenter: Fragmenter | None = None) -> None:
        self.fragmenter = fragmenter

    @abstractmethod
    def choose(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> Choice:
        """(node position, GPU slots on it) for one replica; `candidates` are where it fits, in node order."""


class ScoringPolicy(PlacementPolicy):
    """A policy that scores the candidates: it implements `scores` (higher is better, one column per option of
    placing the replica on the node, see `Fragmenter.deltas`) and may override `slots`.

    A node's scores may depend on the node only through its GPU state id and free CPUs (and on facts of the
    index that never change, such as the largest node): then each (state, free CPUs) is scored once per demand
    and cached, which makes a choice among a few node groups (`CapacityIndex.placement_candidates`) cost a few
    dictionary look-ups. Cached or not, the same numbers are compared in the same order, so the choice is the
    same.
    """

    def __init__(self, fragmenter: Fragmenter | None = None) -> None:
        super().__init__(fragmenter)
        self._cache: dict[Demand, dict[tuple[int, float], tuple[float, np.ndarray]]] = {}
        self._family: object = None  # the index family (shared `memo`) the cache belongs to

    @abstractmethod
    def scores(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> np.ndarray:
        """Score of each option (columns) of each candidate node (rows); higher is better."""

    def slots(self, index: CapacityIndex, i: int, demand: Demand, options: np.ndarray) -> list[int]:
        """GPU slots on the chosen node i; `options` marks its best-scored options."""
        return tightest_slots(index, i, demand)

    def choose(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> Choice:
        row, options = self.best(index, demand, candidates)
        i = int(candidates[row])
        return i, self.slots(index, i, demand, options)

    def best(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> tuple[int, np.ndarray]:
        """(row of the best candidate, first one on ties; which of its options score best)."""
        if candidates.size > SMALL:
            score = self.scores(index, demand, candidates)
            best = score.max(axis=1)
            row = int(np.argmax(best))
            return row, score[row] == best[row]
        if index.memo is not self._family:
            self._family = index.memo
            self._cache.clear()
        table = self._cache.get(demand)
        if table is None or len(table) > CACHE_LIMIT:
            table = self._cache[demand] = {}
        keys = list(zip(index.state[candidates].tolist(), index.cpu_free[candidates].tolist(), strict=True))
        missing = [k for k, key in enumerate(keys) if key not in table]
        if missing:
            score = self.scores(index, demand, candidates[missing])
            best = score.max(axis=1)
            for r, k in enumerate(missing):
                table[keys[k]] = (float(best[r]), score[r] == best[r])
        row, top = 0, table[keys[0]][0]
        for k in range(1, len(keys)):
            value = table[keys[k]][0]
            if value > top:
                row, top = k, value
        return row, table[keys[row]][1]


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
