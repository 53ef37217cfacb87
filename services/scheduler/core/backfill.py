"""EASY backfill: one reservation for the first job blocked on resources; later jobs must not delay it.

The reservation's start is the earliest time the blocked job fits when running jobs end at their time limits
(started_at + timeout; a job placed in this cycle ends at now + timeout). Jobs WITHOUT a time limit are taken
to run forever: they cannot be proven to end, so they never free room in the estimate.

Rule for a job that fits now while a reservation stands (start T):
- it has a time limit and ends by T  -> it may start (it is gone before the reserved job needs the room);
- otherwise (it would still run at T, or it has no time limit) -> it is placed on the nodes the reservation
  does not use if it fits there; else anywhere, but kept only if, at T, the room it takes is not needed by
  the reservation (checked GPU by GPU on the capacity projected to T with the reserved job placed).
The projection stops at the first ending job that makes room, so jobs ending at that same instant later in
the list stay counted as running: the check is conservative (it may refuse a backfill, never delay the head).
If no start can be found (the blocked job would not fit even when every time-limited job has ended), there is
no reservation to protect and later jobs start greedily; the blocked job's estimated start is None.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from services.scheduler.core.demand import Demand
from services.scheduler.core.gang import place_gang
from services.scheduler.core.index import CapacityIndex
from services.scheduler.core.model import Allocation, JobRequest, ReplicaAssignment
from services.scheduler.core.placement.base import Choice, PlacementPolicy


@dataclass(slots=True)
class Reservation:
    job_id: str
    start: float | None
    future: CapacityIndex | None  # the capacity at `start`, with the reserved job placed
    nodes: frozenset[int] = frozenset()  # node positions the reserved job will use

    def outlasts(self, job: JobRequest, now: float) -> bool:
        """Would the job still run when the reservation starts (or can that not be ruled out)?"""
        if self.start is None:
            return False
        return job.timeout is None or now + job.timeout > self.start

    def admits(self, job: JobRequest, demand: Demand, choices: list[Choice], now: float) -> bool:
        if self.future is None or self.start is None:
            return True
        if job.timeout is not None and now + job.timeout <= self.start:
            return True
        done: list[Choice] = []
        for i, slots in choices:
            if not self.future.room_for(i, slots, demand):
                for j, taken in reversed(done):
                    self.future.give(j, taken, demand)
                return False
            self.future.take(i, slots, demand)
            done.append((i, slots))
        return True


def reserve(
    index: CapacityIndex,
    policy: PlacementPolicy,
    job: JobRequest,
    demand: Demand,
    ending: Iterable[tuple[float, tuple[ReplicaAssignment, ...]]],
    now: float,
) -> Reservation:
    """Project the capacity forward through the running jobs' ends until the job fits.

    `ending`: (end time, replicas) of the jobs with a time limit, in order of their end (ties: in the order of
    the running list, then this cycle's placements); `ending_order` makes it lazily."""
    future = index.copy()
    for end, replicas in ending:
        opened = False
        for i in future.release(replicas):
            opened = opened or future.fits_one(i, demand)
        choices = place_gang(future, policy, demand, job.replicas) if opened else None
        if choices is not None:
            return Reservation(job.job_id, max(end, now), future, frozenset(i for i, _ in choices))
    return Reservation(job.job_id, None, None)


_STARTED = attrgetter("started_at")
_TIMEOUT = attrgetter("job.timeout")


def ending_order(
    running: list[Allocation], placed: list[tuple[float, tuple[ReplicaAssignment, ...]]]
) -> Iterator[tuple[float, tuple[ReplicaAssignment, ...]]]:
    """(end, replicas) of the running jobs with a time limit (`started_at + timeout`) and of this cycle's
    placements, in order of their end (a stable sort: equal ends keep the running list's order, then the
    placements'). The ends are computed with numpy; only the jobs the projection reaches are visited."""
    n = len(running)
    ends = np.empty(n + len(placed), dtype=np.float64)
    ends[:n] = np.fromiter(map(_STARTED, running), dtype=np.float64, count=n)
    ends[:n] += np.array(list(map(_TIMEOUT, running)), dtype=np.float64)  # no time limit: None -> NaN
    ends[n:] = [end for end, _ in placed]
    keep = np.flatnonzero(~np.isnan(ends))
    for k in keep[np.argsort(ends[keep], kind="stable")].tolist():
        yield float(ends[k]), (running[k].replicas if k < n else placed[k - n][1])
