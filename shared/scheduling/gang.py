"""Gang placement: every replica of a job is placed, or none is (a partial gang never holds GPUs)."""

from __future__ import annotations

from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.placement.base import Choice, PlacementPolicy


def place_gang(
    index: CapacityIndex, policy: PlacementPolicy, demand: Demand, replicas: int
) -> list[Choice] | None:
    """Place `replicas` copies of `demand` one after another through the policy, taking capacity as it goes.

    Returns the choices (capacity stays taken on `index`), or None with the index exactly as it was.
    """
    taken: list[Choice] = []
    for _ in range(replicas):
        candidates = index.placement_candidates(demand)
        choice = policy.choose(index, demand, candidates) if candidates.size else None
        if choice is None or len(choice[1]) != demand.count:
            undo_gang(index, demand, taken)
            return None
        index.take(choice[0], choice[1], demand)
        taken.append(choice)
    return taken


def undo_gang(index: CapacityIndex, demand: Demand, taken: list[Choice]) -> None:
    for i, slots in reversed(taken):
        index.give(i, slots, demand)
