"""FGD, fragmentation gradient descent (Weng et al., USENIX ATC 2023, "Beware of Fragmentation").

Each replica goes where the expected fragmentation of the cluster (see `core.fragmentation`) grows least. As in
the authors' simulator (the setting behind the published numbers), the growth is turned into an integer score
int(100 * sigmoid(-growth / 1000)), the highest score wins and ties go to the first node in inventory order;
for a GPU share, every GPU of every node is scored and the first GPU with the node's best score is used.
"""

from __future__ import annotations

import numpy as np

from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.fragmentation import Fragmenter
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.placement.base import ScoringPolicy, tightest_slots

NO_SCORE = -(1 << 40)


def fgd_scores(delta: np.ndarray) -> np.ndarray:
    """The authors' integer node score from fragmentation growth (milli-GPU); -inf growth = impossible."""
    with np.errstate(over="ignore", invalid="ignore"):
        score = np.floor(100.0 / (1.0 + np.exp(delta / 1000.0)))
    return np.where(np.isfinite(delta), score, NO_SCORE).astype(np.int64)


def option_slots(index: CapacityIndex, i: int, options: np.ndarray, demand: Demand) -> list[int]:
    """GPU slots on node i for the best-scored options (columns of `Fragmenter.deltas`, boolean row).

    For a share: the lowest GPU slot whose free value is one of the winning options; whole GPUs and CPU-only
    replicas have a single option."""
    if demand.count and not demand.whole:
        values = index.states.share_options(int(index.state[i]), demand.milli)
        winning = {values[j] for j in np.flatnonzero(options[: len(values)]).tolist()}
        free = index.free[i]
        for s in index.eligible(i, demand):
            if free[s] in winning:
                return [s]
    return tightest_slots(index, i, demand)


class Fgd(ScoringPolicy):
    name = Policy.FGD
    needs_popularity = True
    fragmenter: Fragmenter  # (`make_policy` gives one to a policy that needs the shape distribution)

    def scores(self, index: CapacityIndex, demand: Demand, candidates: np.ndarray) -> np.ndarray:
        delta = self.fragmenter.deltas(index.state[candidates], index.cpu_free[candidates], demand)
        return fgd_scores(delta)

    def slots(self, index: CapacityIndex, i: int, demand: Demand, options: np.ndarray) -> list[int]:
        return option_slots(index, i, options, demand)
