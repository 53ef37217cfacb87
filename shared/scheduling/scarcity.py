"""Scarce nodes: the few nodes that some waiting jobs can ONLY run on are kept from the jobs that can run on many.

A job's room is the set of nodes that could hold one of its replicas were they empty (`room`, the rule of
`explain.never_fits` per node; cached per shape for the life of the index). A waiting shape K is *confined*
for a job J when J could run on at least `RATIO` times as many nodes as K, and somewhere K cannot; K's priority
must be at least J's (a job never waits for a lower class). J is then placed, preempts and reserves only
outside the room of every shape confined for it (its *kept* nodes), as long as some job of such a shape waits
(whatever it waits for). J does not take a node that a confined job needs, even when it is the only node free:
J waits for one of its many others (its backfill reservation goes there too), while the confined job could
only wait for that one. With nothing confined waiting, every node is J's again.

One exception keeps the kept nodes busy while they drain (`spare`): where nothing else fits it, J may use a
kept node that it would leave (its time limit) before the jobs already running there end, if no confined job
fits that node now; it then costs a confined job that needs what those jobs hold nothing (in EASY backfill's
terms: it ends before the earliest start the node allows). Without it the kept nodes would stand idle while
they drain.

Why (docs/benchmarks.md, time replay): the openb G3 nodes (8 GPUs, 128 CPUs, 768 GiB) are the
only ones that hold the trace's jobs of 120 CPUs and 625–720 GiB; on a sub-cluster with three of them, two
held for weeks, a job of 88 CPUs that also fits the 58 G2 nodes took the third when it was the only node free
at its reserved start and kept it for 11 days, while three G3-only jobs behind it waited for it.

GPU-model pressure (`placement/gpuyard.py`) steers flexible jobs away from GPU models that constrained jobs
need, softly and only where there is a choice; this rule is about nodes, for every policy, and also where there
is no choice. The cost per cycle is one look-up per distinct waiting shape; the masks are computed once per
shape (a numpy pass over the nodes) and, for each job shape that has confined shapes to avoid, once per cycle.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpuyard.shared.scheduling.demand import Demand, demand_of
from gpuyard.shared.scheduling.explain import gpu_counts
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import EPS, Allocation, JobRequest

RATIO = 8  # K is confined for J when J could run on at least RATIO times as many nodes as K
CACHE_LIMIT = 20_000


def room(index: CapacityIndex, demand: Demand) -> tuple[np.ndarray, int]:
    """(mask of the schedulable nodes that could hold one replica were they empty, how many); cached per demand
    for the life of the index (the nodes' totals never change in it)."""
    cache = _cache(index)
    found = cache.get(demand)
    if found is None:
        mask = index.schedulable & (index.cpus >= demand.cpus - EPS) & (index.memory >= demand.memory)
        if demand.count:
            mask = mask & (gpu_counts(index, demand) >= (demand.count if demand.whole else 1))
        found = cache[demand] = (mask, int(mask.sum()))
    return found


def _cache(index: CapacityIndex) -> dict:
    """Per index family: demand -> room, job key -> demand (started over past CACHE_LIMIT entries)."""
    cache = index.memo.get("scarcity")
    if cache is None or len(cache) > CACHE_LIMIT:
        cache = index.memo["scarcity"] = {}
    return cache


def _shape(key: tuple) -> Demand:
    gpus, _replicas, cpus, memory, gpu_memory, models = key[:6]
    return demand_of(
        JobRequest(
            "", "", gpus=gpus, cpus=cpus, memory=memory, gpu_memory=gpu_memory or None, gpu_models=models
        )
    )


class Scarcity:
    """For one cycle: which nodes each job shape must keep off (see the module), from the waiting shapes."""

    def __init__(self, index: CapacityIndex, keys: Iterable[tuple]) -> None:
        self.index = index
        self._allowed: dict[tuple, tuple[np.ndarray | None, list[Demand]]] = {}
        nodes = int(index.schedulable.sum())
        # (room, its size, priority, demand) of the waiting shapes that few nodes could hold
        self.confined: list[tuple[np.ndarray, int, int, Demand]] = []
        cache = _cache(index)
        for key in keys:
            demand = cache.get(key)
            if demand is None:
                demand = cache[key] = _shape(key)
            mask, size = room(index, demand)
            if size > 0 and size * RATIO <= nodes:
                self.confined.append((mask, size, key[6], demand))

    def allowed(self, job: JobRequest, demand: Demand) -> np.ndarray | None:
        """The nodes this job may use now (a mask), or None: all of them."""
        if not self.confined:
            return None
        return self._avoid(job, demand)[0]

    def spare(
        self, job: JobRequest, demand: Demand, allowed: np.ndarray, drain: np.ndarray, end: float
    ) -> np.ndarray | None:
        """`allowed` and the kept nodes this job may use all the same (None: none): those it leaves by `end`,
        before the jobs already on them would (`drain`), where no job it keeps off them fits now. Taking room
        there does not make a confined job wait longer when it needs what the node's running jobs hold (a whole
        node: the openb case); one that needs less could start in part of a node, which is why a node where
        one fits now is not spare."""
        index = self.index
        extra = ~allowed & index.schedulable & (drain >= end)
        if not extra.any():
            return None
        for i in np.flatnonzero(extra).tolist():
            if any(index.fits_one(i, other) for other in self._avoid(job, demand)[1]):
                extra[i] = False
        return allowed | extra if extra.any() else None

    def _avoid(self, job: JobRequest, demand: Demand) -> tuple[np.ndarray | None, list[Demand]]:
        key = job.key
        found = self._allowed.get(key)
        if found is not None:
            return found
        mine, size = room(self.index, demand)
        avoid, shapes = None, []
        for other, other_size, priority, shape in self.confined:
            if priority >= job.priority and other_size * RATIO <= size and (mine & ~other).any():
                avoid = other.copy() if avoid is None else avoid | other
                shapes.append(shape)
        found = (~avoid, shapes) if avoid is not None and (mine & ~avoid).any() else (None, [])
        self._allowed[key] = found
        return found


def drain_times(
    index: CapacityIndex, running: Iterable[Allocation], placed: Iterable[tuple[float, tuple]]
) -> np.ndarray:
    """Per node, when the jobs on it now will all have ended (their time limits; a job without one: never);
    -inf for a node with nothing on it. `placed`: (end, replicas) of this cycle's placements."""
    drain = np.full(len(index), -np.inf)
    position = index.position
    for alloc in running:
        timeout = alloc.job.timeout
        end = alloc.started_at + timeout if timeout is not None else np.inf
        for r in alloc.replicas:
            i = position.get(r.node)
            if i is not None and end > drain[i]:
                drain[i] = end
    for end, replicas in placed:
        for r in replicas:
            i = position.get(r.node)
            if i is not None and end > drain[i]:
                drain[i] = end
    return drain
