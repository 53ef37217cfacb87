"""EASY backfill with a reservation depth: the first `depth` jobs blocked on resources get reservations; later
jobs must not delay any of them.

The first reservation's start is the earliest time the blocked job fits when running jobs end at their time
limits (started_at + timeout; a job placed in this cycle ends at now + timeout). Jobs WITHOUT a time limit are
taken to run forever: they cannot be proven to end, so they never free room in the estimate. The next blocked
job's reservation continues the same projection from there, with the jobs reserved before it placed (and kept
for good: conservative), so reservations start in line order and each is computed on the room left by the
earlier ones. Depth 1 is classic EASY (Lifka; Maui's RESERVATIONDEPTH): with one reservation, jobs that need
a scarce kind of node (a whole node of one model, or its CPUs) wait one after the other, each for a full drain
of such a node once it is first in line, while small jobs keep taking what frees on the others.

Rule for a job that fits now while reservations stand (starts T1 <= T2 <= ...):
- it has a time limit and ends by T1 -> it may start (it is gone before any reserved job needs the room);
- otherwise -> it is placed on the nodes the reservations it outlasts do not use if it fits there; else
  anywhere, but kept only if, at the start of every reservation it outlasts, the room it takes is not needed
  by the reserved jobs (checked GPU by GPU on the capacity projected to that start, reserved jobs placed).
The projection stops at the first ending job that makes room, so jobs ending at that same instant later in
the list stay counted as running: the check is conservative (it may refuse a backfill, never delay a
reservation). If no start can be found for a blocked job (it would not fit even when every time-limited job
has ended), it gets no reservation and no later job does; its estimated start is None.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.gang import place_gang
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import Allocation, JobRequest, ReplicaAssignment
from gpuyard.shared.scheduling.placement.base import Choice, PlacementPolicy


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
        if not self.outlasts(job, now):
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

    def withdraw(self, job: JobRequest, demand: Demand, choices: list[Choice], now: float) -> None:
        """Undo `admits` (it said yes; a later reservation said no)."""
        if self.future is not None and self.outlasts(job, now):
            for i, slots in reversed(choices):
                self.future.give(i, slots, demand)


class Projection:
    """The capacity projected forward through the running jobs' ends, shared by a cycle's reservations.

    `ending`: (end time, replicas) of the jobs with a time limit, in order of their end (ties: in the order of
    the running list, then this cycle's placements); `ending_order` makes it lazily.

    `reserve` gives the next blocked job in line the earliest end (not before the previous reservation's
    start) at which it fits with the jobs reserved before it placed. The index is copied once, for the first
    reservation; each further one copies the projection it continues (the earlier reservation keeps its own
    capacity at its start, which later admissions change)."""

    def __init__(
        self,
        index: CapacityIndex,
        policy: PlacementPolicy,
        ending: Iterable[tuple[float, tuple[ReplicaAssignment, ...]]],
        now: float,
    ) -> None:
        self.index = index
        self.policy = policy
        self.ending = iter(ending)
        self.now = now
        self.future: CapacityIndex | None = None
        self.at = now  # the time the projection has reached
        self.exhausted = False

    def reserve(self, job: JobRequest, demand: Demand, allowed: np.ndarray | None = None) -> Reservation:
        """`allowed`: the nodes the job may use (`scarcity.Scarcity.allowed`; None: every node)."""
        if self.exhausted:
            return Reservation(job.job_id, None, None)
        if self.future is None:
            future = self.future = self.index.copy()
            choices = None  # the job does not fit now (it is blocked)
        else:
            future = self.future = self.future.copy()  # the previous reservation keeps the one it had
            choices = self._place(future, demand, job.replicas, allowed)
        for end, replicas in self.ending if choices is None else ():
            opened = False
            for i in future.release(replicas):
                opened = opened or (future.fits_one(i, demand) and (allowed is None or allowed[i]))
            if opened:
                choices = self._place(future, demand, job.replicas, allowed)
                if choices is not None:
                    self.at = max(end, self.at)
                    break
        if choices is None:
            self.exhausted = True
            return Reservation(job.job_id, None, None)
        return Reservation(job.job_id, self.at, future, frozenset(i for i, _ in choices))

    def _place(
        self, future: CapacityIndex, demand: Demand, replicas: int, allowed: np.ndarray | None
    ) -> list[Choice] | None:
        future.restrict = allowed
        try:
            return place_gang(future, self.policy, demand, replicas)
        finally:
            future.restrict = None


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
