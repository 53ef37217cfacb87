"""One scheduling cycle: order the queue, admit what quotas allow, place gangs, preempt, backfill, explain.

`decide(index, running, queue, config, quotas, now)` is the one entry point to a cycle, on a `CapacityIndex`
(updated in place with the placements): the live service gets its index from a `cluster.HeldCluster`, the
trace simulator keeps its own, and a caller with a snapshot builds one (`CapacityIndex.from_state`).

Per job, in the order of `ordering.in_order`:
1. retry backoff (`not_before` in the future) -> waits;
2. strict order (`backfill=BackfillMode.OFF`) and an earlier job is blocked -> waits behind it;
3. user cap / borrowing off -> waits (quota codes);
4. a job of the same shape already failed to fit this cycle -> same answer without searching again
   (capacity only shrinks inside a cycle);
5. place all replicas through the placement policy (gang: all or nothing);
   - placed while a backfill reservation stands: kept only if it does not delay the reservation;
   - not placed: try preemption (priority, or reclaim of borrowed quota); otherwise explain with numbers.
     The first `config.reservation_depth` jobs blocked on resources get reservations (EASY backfill) and an
     estimated start. With a short-first window (`config.short_first_window`, the line order of
     `queue.line_order`) these are the oldest waiting jobs instead (priority, then arrival), whose
     reservations are made before anything is placed: see `protect`.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from gpuyard.shared.contracts.policies import BackfillMode
from gpuyard.shared.contracts.reasons import GPU_SHORTAGES, PendingCode
from gpuyard.shared.contracts.stops import PreemptionCause
from gpuyard.shared.contracts.units import count_text, format_rough_duration
from gpuyard.shared.scheduling import reasons as R
from gpuyard.shared.scheduling.backfill import Projection, Reservation, ending_order
from gpuyard.shared.scheduling.demand import Demand, demand_of, shape_key
from gpuyard.shared.scheduling.explain import never_fits, no_room_now
from gpuyard.shared.scheduling.gang import place_gang, undo_gang
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import (
    Allocation,
    CycleResult,
    GpuAssignment,
    JobRequest,
    Placement,
    Preemption,
    ReplicaAssignment,
    SchedulerConfig,
)
from gpuyard.shared.scheduling.ordering import Order
from gpuyard.shared.scheduling.placement import POLICIES, make_policy
from gpuyard.shared.scheduling.placement.base import Choice
from gpuyard.shared.scheduling.popularity import popularity_for
from gpuyard.shared.scheduling.preemption import choose_victims, eligible_victims, lost_work
from gpuyard.shared.scheduling.queue import HeldQueue, Pending
from gpuyard.shared.scheduling.quota import QuotaLedger, RunningKinds, borrowed_jobs
from gpuyard.shared.scheduling.scarcity import Scarcity, drain_times, room

NEVER = R.NEVER_HELD | {PendingCode.NO_NODES}  # not in this cycle
MAX_PREEMPTION_SEARCHES = 32  # per cycle: bounded work when many jobs could preempt
SETTLE_BY_SHAPE = True  # answer a blocked shape's later jobs from its cached reason (tests turn it off)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold Python's cyclic garbage collector for the length of one cycle.

    A cycle allocates one reason per waiting job and lots of short-lived tuples, which trigger collections
    that walk every live object (the caller's queue and running jobs included): tens of milliseconds, at
    random. Nothing the core allocates is cyclic garbage (reference counting frees it), so collection waits
    for the end of the cycle; a caller that had switched the collector off keeps it off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_BACKFILL_MODES = frozenset(BackfillMode)  # (a set: a plain string from the caller is found by value)


class _Cycle:
    """The state of one cycle's decisions (kept together so each step stays a small method)."""

    def __init__(
        self,
        index: CapacityIndex,
        running: list[Allocation],
        queue: HeldQueue,
        config: SchedulerConfig,
        quotas: dict[str, float],
        now: float,
        kinds: RunningKinds | None = None,
    ) -> None:
        if config.backfill not in _BACKFILL_MODES:
            raise ValueError(f"backfill must be one of {', '.join(BackfillMode)}, not {config.backfill!r}")
        self.index = index
        self.running = running
        self.config = config
        self.quotas = quotas
        self.now = now
        if config.policy not in POLICIES:
            make_policy(config.policy)  # raises with the list of known policies
        self.kinds = kinds = kinds if kinds is not None else RunningKinds(running)
        self.policy = make_policy(config.policy, popularity_for(config, queue, running, kinds))
        capacity = (
            index.total_gpus(),
            float(index.cpus[index.schedulable].sum()),
            float(index.memory[index.schedulable].sum()),
        )
        self.ledger = QuotaLedger(quotas, running, config, capacity, kinds)
        # the nodes a job must keep off (`core/scarcity.py`)
        self.scarcity = Scarcity(index, queue.keys if config.keep_scarce_nodes else ())
        # the result's `pending`: why each job waits, and (`stopped`) the jobs not looked at
        self.lined = Pending()
        self.result = CycleResult(pending=self.lined)
        self.waiting = 0
        self.demands: dict[tuple, Demand] = {}
        self.failed: dict[tuple, R.Blocker] = {}  # shape -> why it does not fit (valid for the whole cycle)
        # shape -> the reservation it would delay
        self.delayed: dict[tuple, tuple[Reservation, R.Blocker]] = {}
        self.head: JobRequest | None = None  # first job blocked on resources
        self.reservations: list[Reservation] = []  # in line order; their starts never decrease
        self.projection: Projection | None = None
        self.depth = config.reservation_depth if config.backfill == BackfillMode.EASY else 0
        # with a short-first window: the jobs that may get the reservations, and the starts of those made
        # before the loop (`protect`)
        self.protected: frozenset[str] | None = None
        self.reserved: dict[str, float] = {}
        self.fitting: set[str] = set()  # protected jobs that fit before the loop, yet to be looked at
        self.fitting_tried = -1  # how many were left when `none_fitting` last found one that still may fit
        self.placed_ending: list[tuple[float, tuple[ReplicaAssignment, ...]]] = []
        self.placed_until: list[tuple[float, tuple[ReplicaAssignment, ...]]] = []  # no time limit: inf
        self._drain: np.ndarray | None = None  # per node, when what is on it ends (`scarcity.drain_times`)
        self._borrowed: set[str] | None = None
        self._lowest_priority: int | None = None
        self.victims: set[str] = set()
        self.preemption_searches = 0
        self.no_victims: set[tuple] = set()
        # Without quotas and user caps, a job whose shape failed this cycle, with no victims to preempt for its
        # priority and the head already chosen, gets exactly its shape's cached reason: (*shape, priority) ->
        # that reason, answered before anything else is looked at (most of a long queue of blocked jobs).
        self.strict = config.backfill == BackfillMode.OFF
        self.pending = self.lined.known
        self.simple = SETTLE_BY_SHAPE and not self.ledger.quotas_on and not self.ledger.caps_on
        self.settled: dict[tuple, R.Blocker] = {}
        self.examined = 0  # jobs looked at one by one (the rest of a stopped cycle is answered by the order)
        self.left: Counter = Counter()
        self.unsettled = 0

    def protect(self, queue: HeldQueue) -> None:
        """With a short-first window the reservations go to the oldest waiting jobs, made before anything is
        placed: the `depth` oldest (`queue.ages`: priority, then arrival) and, besides them, the
        `config.shape_reservations` oldest of each shape class (`shape_class`), leaving out those in their
        retry backoff, those their quota holds and those no node could ever hold. Those that do not fit now
        reserve in age order, and every job of the line (which lets short jobs pass) must then not delay them,
        as it must not delay the first blocked jobs in EASY backfill. Protection stays with age: a job that
        needs a drained node is not put off by each short job that passes it in line. And a job of a rare
        shape (a whole node of 8 GPUs in a queue of single GPUs) is protected from the time it is among the
        oldest of its shape, not only once it is among the oldest of the whole queue: long jobs that arrive
        meanwhile do not take the nodes that drain for it. Cost: a pass over the waiting jobs in age order,
        which stops once each class has its jobs; up to `depth` + classes x `shape_reservations` placement
        tries (undone) and the projection the reservations need anyway."""
        jobs, now = queue.jobs, self.now
        found: list[str] = []
        candidates: list[tuple[JobRequest, Demand]] = []
        per_shape = self.config.shape_reservations
        classes: dict[tuple, tuple | None] = {}  # shape_key -> its shape class (None: no node could hold it)
        wanted: Counter = Counter()  # shape class -> how many of its jobs are still to be taken
        if per_shape > 0:
            for job_key, n in queue.keys.items():
                found_class = self.shape_class(job_key[:6], job_key[1])
                if found_class is not None:
                    wanted[found_class] = min(per_shape, wanted[found_class] + n)
        left = sum(wanted.values())
        for _priority, _at, job_id in queue.ages:
            if len(found) >= self.depth and not left:
                break
            job = jobs[job_id]
            if job.not_before is not None and job.not_before > now:
                continue
            key = shape_key(job)
            shape = classes.get(key, False)
            if shape is False:
                shape = classes[key] = self.shape_class(key, job.replicas)
            if shape is None:
                continue
            taken = wanted[shape] > 0
            if (taken or len(found) < self.depth) and self.ledger.admission_blocker(job) is None:
                found.append(job_id)
                candidates.append((job, self.demands[key]))
                if taken:
                    wanted[shape] -= 1
                    left -= 1
        self.protected = frozenset(found)
        for job, demand in candidates:
            allowed = self.allowed(job, demand)
            choices = self.under(allowed, place_gang, self.index, self.policy, demand, job.replicas)
            if choices is not None:  # it fits now: the line places it (or it reserves when it gets there)
                undo_gang(self.index, demand, choices)
                self.fitting.add(job.job_id)
                continue
            reservation = self.projected().reserve(job, demand, allowed)
            if reservation.start is None:
                break  # (the projection is exhausted: no later job gets one either)
            self.reservations.append(reservation)
            self.reserved[job.job_id] = reservation.start

    def shape_class(self, key: tuple, replicas: int) -> tuple | None:
        """The class of a shape (`shape_key`) for `protect`: (GPUs per replica, whole GPUs or a share, GPU
        models, replicas, how many nodes could hold one replica); None when no node could."""
        demand = self.demands.get(key)
        if demand is None:
            gpus, _replicas, cpus, memory, gpu_memory, models = key[:6]
            demand = self.demands[key] = demand_of(
                JobRequest("", "", gpus, cpus=cpus, memory=memory, gpu_memory=gpu_memory, gpu_models=models)
            )
        size = room(self.index, demand)[1]
        return (demand.count, demand.whole, demand.models, replicas, size) if size > 0 else None

    # ------------------------------------------------------------------------------------------- the loop
    def run(self, queue: HeldQueue) -> CycleResult:
        # the settled answer (see `settle`) is given right here, before `consider`: most jobs of a long queue
        # on a full cluster get it (not in strict order, where waiting behind the head comes first). Once every
        # job left would get it (`left` by key, `unsettled` those whose key has no answer yet; none in its backoff
        # or `fitting`), the cycle stops: their reasons follow from the order and `protect`'s starts (`Pending`).
        fast = self.simple and not self.strict
        settled, pending, now = self.settled, self.pending, self.now
        order = Order(queue, self.ledger, self.config.fair_share)
        if self.depth and queue.window > 0:
            self.protect(queue)
        protected, fitting = self.protected, self.fitting
        if fast:
            self.left = left = Counter(queue.keys)
            self.unsettled = len(queue)
            # (the jobs of `backoff` all have a `not_before`)
            backing_off = sum(1 for job in queue.backoff.values() if (job.not_before or 0.0) > now)
        for job in order:
            if fast:
                key = job.key
                left[key] -= 1
                if key not in settled:
                    self.unsettled -= 1
                if job.not_before is not None and job.not_before > now:
                    backing_off -= 1
                elif settled and not (protected and job.job_id in protected):
                    found = settled.get(key)
                    if found is not None:
                        if found.in_line:
                            self.waiting += 1
                        self.examined += 1
                        pending[job.job_id] = found.at(self.waiting)
                        if not self.unsettled and not backing_off and self.none_fitting(queue):
                            break
                        continue
            self.examined += 1
            fitting.discard(job.job_id)
            self.consider(job)
            if fast and not self.unsettled and not backing_off and self.none_fitting(queue):
                break
        else:
            return self.result
        self.lined.stopped(queue, order.rest(), settled, self.waiting, (self.reserved, self.now))
        if fitting:
            self.reserve_unfitting(queue)
        return self.result

    def none_fitting(self, queue: HeldQueue) -> bool:
        """Once every job left has its settled answer, only the protected jobs that fitted before the loop
        (`fitting`) keep the cycle going, wherever fair share puts them in line. True when none is left or none
        fits any more (its shape failed since), could preempt or delays a reservation: each would only reserve
        when the line reached it, which `reserve_unfitting` does, in line order, once the cycle stops."""
        if not self.fitting:
            return True
        if len(self.fitting) == self.fitting_tried:
            return False
        for job_id in self.fitting:
            job = queue.jobs[job_id]
            key = shape_key(job)
            failed = self.failed.get(key)
            reserves_only = failed is not None and failed.code not in NEVER and key not in self.delayed
            if not (reserves_only and self.preemption_settled(job, key)):
                self.fitting_tried = len(self.fitting)
                return False
        return True

    def reserve_unfitting(self, queue: HeldQueue) -> None:
        """The reservations of the jobs `none_fitting` let the cycle stop before, in their places in line (the
        stopped cycle's `Pending`), their estimated starts read from `reserved`."""
        for job_id in sorted(self.fitting, key=lambda job_id: self.lined[job_id].position or 0):
            if len(self.reservations) >= self.depth or (
                self.projection is not None and self.projection.exhausted
            ):
                break
            job = queue.jobs[job_id]
            demand = self.demands[shape_key(job)]
            reservation = self.projected().reserve(job, demand, self.allowed(job, demand))
            if reservation.start is not None:
                self.reservations.append(reservation)
                self.reserved[job_id] = reservation.start

    def projected(self) -> Projection:
        """When the running (and this cycle's placed) jobs' time limits free their capacity, for reservations
        (made at the first one)."""
        if self.projection is None:
            ending = ending_order(self.running, self.placed_ending)
            self.projection = Projection(self.index, self.policy, ending, self.now)
        return self.projection

    def wait(self, job: JobRequest, blocker: R.Blocker, estimated_start: float | None = None) -> None:
        """The job waits: its place in line is the next one, unless no node could ever hold it (then it has
        none and takes none: `reasons.NEVER_HELD`)."""
        if blocker.in_line:
            self.waiting += 1
        self.pending[job.job_id] = blocker.at(self.waiting, estimated_start, self.now)

    def held_back(self, job: JobRequest, key: tuple) -> R.Blocker | None:
        """Why the job waits before any placement is tried, if it does: its retry backoff, strict order behind
        the head, a reason settled earlier in the cycle (not for a job that holds a reservation), its tenant's
        quota, or a reservation it would delay."""
        protected = self.protected is not None and job.job_id in self.protected
        if job.not_before is not None and job.not_before > self.now:
            return R.Blocker(
                PendingCode.RETRY_BACKOFF,
                f"waiting {format_rough_duration(job.not_before - self.now)} before the next attempt (retry backoff)",
                {"not_before": job.not_before},
            )
        if self.strict and self.head is not None:
            return R.Blocker(
                PendingCode.BLOCKED_BY_HEAD,
                f"strict order: waits behind job {self.head.job_id}",
                {"head": self.head.job_id},
            )
        if self.simple and not protected and (settled := self.settled.get(job.key)) is not None:
            return settled
        blocker = self.ledger.admission_blocker(job)
        if blocker is not None:
            return blocker
        delayed = self.delayed.get(key)
        if delayed is not None and delayed[0].outlasts(job, self.now):
            return delayed[1]
        return None

    def consider(self, job: JobRequest) -> None:
        key = shape_key(job)
        blocker = self.held_back(job, key)
        if blocker is not None:
            self.wait(job, blocker)
            return
        demand = self.demands.get(key)
        if demand is None:
            demand = self.demands[key] = demand_of(job)
        cached = self.failed.get(key)
        if cached is not None:
            self.blocked(job, demand, key, cached)
            return
        choices = None
        allowed = self.allowed(job, demand)
        outlasted = self.outlasted(job)
        if outlasted and job.job_id in self.reserved:  # (it does not wait for its own reservation)
            outlasted = [r for r in outlasted if r.job_id != job.job_id]
        if outlasted:
            choices = self.place_around_reservations(demand, job.replicas, outlasted, allowed)
        if choices is None:
            if allowed is None:
                choices = place_gang(self.index, self.policy, demand, job.replicas)
            else:
                choices = self.under(allowed, place_gang, self.index, self.policy, demand, job.replicas)
        if choices is None and allowed is not None and job.timeout is not None:
            end = self.now + job.timeout
            spare = self.scarcity.spare(job, demand, allowed, self.drain(), end)
            if spare is not None:  # kept nodes it leaves before they would be free anyway
                choices = self.under(spare, place_gang, self.index, self.policy, demand, job.replicas)
        if choices is None:
            self.blocked(job, demand, key, None)
            return
        for k, reservation in enumerate(outlasted):
            if not reservation.admits(job, demand, choices, self.now):
                for earlier in outlasted[:k]:
                    earlier.withdraw(job, demand, choices, self.now)
                undo_gang(self.index, demand, choices)
                head = reservation.job_id
                self.delayed[key] = (
                    reservation,
                    R.Blocker(
                        PendingCode.BACKFILL_WOULD_DELAY,
                        f"fits now but would delay the reserved start of job {head}",
                        {"reserved_for": head, "reserved_start": reservation.start},
                    ),
                )
                self.wait(job, self.delayed[key][1])
                return
        self.placed(job, demand, choices)

    def allowed(self, job: JobRequest, demand: Demand) -> np.ndarray | None:
        """Where the job may go (None: every node): not kept off it (`scarcity`), building its own Python."""
        allowed = self.scarcity.allowed(job, demand) if self.scarcity.confined else None
        return self.index.python_mask(job.python, allowed) if job.python else allowed

    def outlasted(self, job: JobRequest) -> list[Reservation]:
        """The reservations this job would still run at (a prefix: their starts never decrease)."""
        reservations = self.reservations
        if not reservations or not reservations[0].outlasts(job, self.now):
            return []
        if len(reservations) == 1:
            return reservations
        return [r for r in reservations if r.outlasts(job, self.now)]

    def place_around_reservations(
        self, demand: Demand, replicas: int, reservations: list[Reservation], allowed: np.ndarray | None
    ) -> list[Choice] | None:
        """Try the nodes these reservations do not need first (a long job there can never delay them)."""
        reserved = (
            reservations[0].nodes
            if len(reservations) == 1
            else frozenset().union(*(r.nodes for r in reservations))
        )
        if not reserved:
            return None
        index = self.index
        elsewhere = np.ones(len(index), dtype=bool) if allowed is None else allowed.copy()
        elsewhere[list(reserved)] = False
        return self.under(elsewhere, place_gang, index, self.policy, demand, replicas)

    def under(self, allowed: np.ndarray | None, fn, *args):
        """`fn(*args)` with placement (and what explains or preempts for it) only on the `allowed` nodes
        (`index.restrict`); None: every node."""
        if allowed is None:
            return fn(*args)
        self.index.restrict = allowed
        try:
            return fn(*args)
        finally:
            self.index.restrict = None

    # ------------------------------------------------------------------------------------------- outcomes
    def placed(self, job: JobRequest, demand: Demand, choices: list[Choice]) -> None:
        borrowed = self.ledger.would_borrow(job)
        self.ledger.add(job)
        index = self.index
        replicas = []
        for replica, (i, slots) in enumerate(choices):
            ids = index.gpu_ids[i]
            memory = (
                int(demand.gpu_memory) if demand.count and not demand.whole and demand.gpu_memory else None
            )
            gpus = tuple(GpuAssignment(ids[s], demand.fraction, memory) for s in slots)
            replicas.append(ReplicaAssignment(replica, index.names[i], gpus, job.cpus, job.memory))
        replicas_t = tuple(replicas)
        self.result.placements.append(Placement(job.job_id, replicas_t, borrowed))
        if job.timeout is not None:
            self.placed_ending.append((self.now + job.timeout, replicas_t))
        if self.scarcity.confined:  # (what `drain` needs; only kept nodes ask)
            end = self.now + job.timeout if job.timeout is not None else np.inf
            self.placed_until.append((end, replicas_t))
            if self._drain is not None:
                for i, _slots in choices:
                    self._drain[i] = max(self._drain[i], end)

    def drain(self) -> np.ndarray:
        if self._drain is None:
            self._drain = drain_times(self.index, self.running, self.placed_until)
        return self._drain

    def blocked(self, job: JobRequest, demand: Demand, key: tuple, cached: R.Blocker | None) -> None:
        """The job does not fit now; `cached` is what an earlier job of the same shape learnt this cycle."""
        if cached is None:
            never = never_fits(self.index, job, demand)
            if never is not None:
                self.failed[key] = never
                self.settle(key, job, never)
                self.wait(job, never)
                return
        elif cached.code in NEVER:
            self.settle(key, job, cached)
            self.wait(job, cached)
            return
        allowed = self.allowed(job, demand)
        if self.config.preemption and self.under(allowed, self.try_preempt, job, demand, key):
            return
        if cached is None:
            cached = self.failed[key] = self.under(allowed, no_room_now, self.index, job, demand)
        # A borrowing job is told about its quota only when GPUs are what it lacks (not CPUs or memory).
        short_of_gpus = cached.code in GPU_SHORTAGES
        blocker = (
            self.ledger.quota_blocker(job) if short_of_gpus and self.ledger.would_borrow(job) else cached
        )
        reserving = (
            len(self.reservations) < self.depth
            and not (self.projection is not None and self.projection.exhausted)
            and (self.protected is None or (job.job_id in self.protected and job.job_id not in self.reserved))
        )
        estimated = self.reserved.get(job.job_id) if self.reserved else None
        if self.head is not None and not reserving and self.preemption_settled(job, key):
            self.settle(key, job, blocker)
        if self.head is None:
            self.head = job
        if reserving:
            reservation = self.projected().reserve(job, demand, allowed)
            if reservation.start is not None:
                self.reservations.append(reservation)
                estimated = reservation.start
        self.wait(job, blocker, estimated)

    def settle(self, key: tuple, job: JobRequest, blocker: R.Blocker) -> None:
        """Every later job of this shape and priority gets `blocker` (see `simple`; never while a job of the
        shape may still be answered by the backfill reservation instead)."""
        if self.simple and key not in self.delayed:
            if job.key not in self.settled and not self.strict:
                self.unsettled -= self.left[job.key]
            self.settled[job.key] = blocker

    def preemption_settled(self, job: JobRequest, key: tuple) -> bool:
        """Would a later job of this shape and priority certainly not preempt either, nor hold a reservation?"""
        return (
            not self.config.preemption
            or self.preemption_searches >= MAX_PREEMPTION_SEARCHES
            or self.search_key(job, key) in self.no_victims
        )

    def search_key(self, job: JobRequest, key: tuple) -> tuple:
        reclaim = self.ledger.quotas_on and not self.ledger.would_borrow(job)
        return (key, job.priority, job.tenant if self.ledger.quotas_on else "", reclaim)

    def try_preempt(self, job: JobRequest, demand: Demand, key: tuple) -> bool:
        reclaim = self.ledger.quotas_on and not self.ledger.would_borrow(job)
        search_key = (key, job.priority, job.tenant if self.ledger.quotas_on else "", reclaim)
        if search_key in self.no_victims or self.preemption_searches >= MAX_PREEMPTION_SEARCHES:
            return False
        if self._borrowed is None:
            self._borrowed = borrowed_jobs(self.running, self.quotas)
            self._lowest_priority = self.kinds.lowest_priority()
        if not self._borrowed and (self._lowest_priority is None or self._lowest_priority >= job.priority):
            self.no_victims.add(search_key)
            return False
        candidates = eligible_victims(
            job,
            self.running,
            self._borrowed,
            self.ledger.quotas_on,
            reclaim,
            self.config,
            self.now,
            self.victims,
        )
        if not candidates:
            self.no_victims.add(search_key)
            return False
        self.preemption_searches += 1
        victims = choose_victims(self.index, self.policy, demand, job.replicas, candidates)
        if victims is None:
            self.no_victims.add(search_key)
            return False
        names = []
        for alloc in victims:
            why = PreemptionCause.PRIORITY if alloc.job.priority < job.priority else PreemptionCause.RECLAIM
            lost = lost_work(alloc, self.now)
            self.result.preemptions.append(Preemption(alloc.job.job_id, why, job.job_id, lost))
            self.victims.add(alloc.job.job_id)
            names.append(alloc.job.job_id)
        gpus = sum(a.job.total_gpus for a in victims)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self.wait(
            job,
            R.Blocker(
                PendingCode.PREEMPTING,
                f"preempting {len(names)} job{'s' if len(names) != 1 else ''} ({shown}) to free {count_text(gpus, 'GPU')}",
                {"victims": names, "gpus": gpus},
            ),
        )
        return True


def decide(
    index: CapacityIndex,
    running: list[Allocation],
    queue: list[JobRequest] | HeldQueue,
    config: SchedulerConfig,
    quotas: dict[str, float] | None = None,
    now: float = 0.0,
    kinds: RunningKinds | None = None,
) -> CycleResult:
    """Decide placements, preemptions and reasons for one cycle.

    `index`: the free capacity, updated in place with each placement; `running`: what running jobs hold (the
    preemption candidates and the backfill reservation's end times); `quotas`: tenant -> guaranteed GPUs
    (empty: no quotas); `now`: the caller's clock in seconds; `kinds`: the running jobs already counted (see
    `RunningKinds`), else they are counted here."""
    with gc_paused():
        if isinstance(queue, HeldQueue):
            queue.reorder(config.short_first_window)
            queue.prepare()
        else:
            queue = HeldQueue(queue, config.short_first_window)
        return _Cycle(index, running, queue, config, quotas or {}, now, kinds).run(queue)
