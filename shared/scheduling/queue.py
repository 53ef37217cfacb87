"""The waiting jobs as a caller keeps them between cycles, in the order a cycle considers them, and the reasons
of a cycle as a mapping that computes most of them when read.

A `HeldQueue` is told what changed (`put`, `drop`); the changes are applied at the next cycle (`prepare`), so
what a cycle answered about the queue stays valid until the next one. It keeps, per priority class, the jobs
in line order and, per class and tenant, the tenant's own jobs in that order: the order of `ordering.in_order`
without sorting the whole queue every cycle. Line order (`line_order`) is arrival order (submitted_at, then
job id) with a short-first window W (`SchedulerConfig.short_first_window`): a job's place is its arrival plus
its time limit, at most W (no time limit: W). A short job passes the longer ones that arrived less than the
difference of their limits before it, never one that has waited W; W = 0 is plain arrival order. The key
never changes while a job waits, so the lists stay sorted between cycles. It also counts the jobs per
`JobRequest.key` (shape popularity, and what a cycle still has to look at) and keeps the jobs with a retry
backoff apart.

`Pending` is `CycleResult.pending`: a mapping job id -> `Reason`. The jobs a cycle looked at are in it
explicitly; when every job left in the order would get its shape's settled answer (a full cluster, a long
queue of alike jobs), the cycle stops there, and the rest of the reasons are `Blocker.at(position)` of the
settled answers, computed when read (a job's position by bisection in its tenant's list, less the jobs before
it that no node could ever hold: they have no place in line).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from operator import attrgetter

from gpuyard.shared.scheduling.model import JobRequest
from gpuyard.shared.scheduling.reasons import Blocker, Reason

ARRIVAL = attrgetter("submitted_at", "job_id")  # arrival order (a short-first window of 0)


def line_order(window: float = 0.0):
    """The key of the order inside a priority class (and a tenant): (submitted_at + min(timeout, window), job
    id); a job without a time limit counts the whole window. `window` <= 0: `ARRIVAL`."""
    if window <= 0:
        return ARRIVAL

    def key(job: JobRequest) -> tuple:
        limit = job.timeout
        return (job.submitted_at + (window if limit is None or limit > window else limit), job.job_id)

    return key


_BULK = 32  # more new jobs than this for one list: appended and sorted once, not inserted one by one


class HeldQueue:
    def __init__(self, jobs: Iterable[JobRequest] = (), window: float = 0.0) -> None:
        self.window = window  # the short-first window of the line order (see the module)
        self.order = line_order(window)
        # with a window: (-priority, submitted_at, job id) of every job, sorted (`cycle._Cycle.protect`)
        self.ages: list[tuple] = []
        self.jobs: dict[str, JobRequest] = {}
        self.keys: Counter = Counter()  # JobRequest.key -> waiting jobs (in the order first put)
        # JobRequest.key -> its jobs by id, for the keys asked about (`of`), kept up to date from then on
        self.members: dict[tuple, dict[str, JobRequest]] = {}
        self.backoff: dict[str, JobRequest] = {}  # the jobs with a not_before
        self.classes: dict[int, list[JobRequest]] = {}  # priority -> its jobs in arrival order
        self.tenants: dict[int, dict[str, list[JobRequest]]] = {}  # priority -> tenant -> its jobs, likewise
        self._changes: dict[str, JobRequest | None] = {}
        for job in jobs:
            self.put(job)
        self.prepare()

    def reorder(self, window: float) -> None:
        """Keep the lists in the line order of this short-first window from now on (sorted again once if it
        changed: a caller that made the queue before it knew the configuration)."""
        if window == self.window:
            return
        self.window, self.order = window, line_order(window)
        for jobs in self.classes.values():
            jobs.sort(key=self.order)
        for by_tenant in self.tenants.values():
            for jobs in by_tenant.values():
                jobs.sort(key=self.order)
        self.ages = sorted(map(_age, self.jobs.values())) if window > 0 else []

    def put(self, job: JobRequest) -> None:
        """The job waits (new, or what is known of it changed)."""
        self._changes[job.job_id] = job

    def drop(self, job_id: str) -> None:
        """The job does not wait any more (placed, cancelled, ended)."""
        self._changes[job_id] = None

    def __len__(self) -> int:
        return len(self.jobs)

    def prepare(self) -> None:
        """Apply the changes told since the last cycle (a cycle calls this first)."""
        changes, self._changes = self._changes, {}
        added: dict[tuple, list[JobRequest]] = {}
        ages: list[tuple] = []
        for job_id, job in changes.items():
            old = self.jobs.get(job_id)
            if old is not None:
                if old is job or old == job:
                    continue  # (the same request: it keeps its place, and the object a cycle answered for)
                self._remove(old)
            if job is not None:
                self.jobs[job_id] = job
                self.keys[job.key] += 1
                if self.members and (members := self.members.get(job.key)) is not None:
                    members[job_id] = job
                if job.not_before is not None:
                    self.backoff[job_id] = job
                added.setdefault((job.priority, None), []).append(job)
                added.setdefault((job.priority, job.tenant), []).append(job)
                if self.window > 0:
                    ages.append(_age(job))
        if len(ages) > _BULK:
            self.ages += ages
            self.ages.sort()
        else:
            for age in ages:
                bisect.insort(self.ages, age)
        for (priority, tenant), jobs in added.items():
            if tenant is None:
                target = self.classes.get(priority)
                if target is None:
                    target = self.classes[priority] = []
                    self.classes = dict(sorted(self.classes.items(), reverse=True))  # high priority first
            else:
                by_tenant = self.tenants.setdefault(priority, {})
                target = by_tenant.setdefault(tenant, [])
            if len(jobs) > _BULK:
                _merge(target, jobs, self.order)
            else:
                for job in jobs:
                    bisect.insort(target, job, key=self.order)

    def _remove(self, job: JobRequest) -> None:
        del self.jobs[job.job_id]
        self.backoff.pop(job.job_id, None)
        self.keys[job.key] -= 1
        if not self.keys[job.key]:
            del self.keys[job.key]
        if self.members and (members := self.members.get(job.key)) is not None:
            del members[job.job_id]
            if not members:
                del self.members[job.key]
        if self.window > 0:
            ages = self.ages
            del ages[bisect.bisect_left(ages, _age(job))]
        _take(self.classes, job.priority, job, self.order)
        by_tenant = self.tenants[job.priority]
        _take(by_tenant, job.tenant, job, self.order)
        if not by_tenant:
            del self.tenants[job.priority]

    def of(self, key: tuple) -> dict[str, JobRequest]:
        """The waiting jobs with this `JobRequest.key`, by id: found once by going through the queue (the keys
        asked about are those of jobs no node could hold: few), then kept up to date by `prepare`."""
        found = self.members.get(key)
        if found is None:
            if key not in self.keys:
                return {}
            found = self.members[key] = {j.job_id: j for j in self.jobs.values() if j.key == key}
        return found

    def position_in(self, jobs: list[JobRequest], job: JobRequest) -> int | None:
        """Where `job` is in `jobs` (one of this queue's lists), or None."""
        order = self.order
        i = bisect.bisect_left(jobs, order(job), key=order)
        return i if i < len(jobs) and jobs[i] is job else None


def _age(job: JobRequest) -> tuple:
    return (-job.priority, job.submitted_at, job.job_id)


def _merge(target: list[JobRequest], jobs: list[JobRequest], order=ARRIVAL) -> None:
    """Put `jobs` into `target` (in line order, `order` its key): work in the number of new jobs and of the
    jobs they overtake, not in the length of `target`. New jobs mostly arrive after every job that waits, so
    they are appended; sorting the whole list instead (a key for each of its jobs) was a cost in the depth of
    the queue on every cycle that received a burst."""
    jobs.sort(key=order)
    at = bisect.bisect_right(target, order(jobs[0]), key=order)  # the first job a new one overtakes
    if at == len(target):
        target.extend(jobs)
        return
    overtaken = target[at:]
    del target[at:]
    target.extend(heapq.merge(overtaken, jobs, key=order))


def _take(lists: dict, name, job: JobRequest, order=ARRIVAL) -> None:
    jobs = lists[name]
    i = bisect.bisect_left(jobs, order(job), key=order)
    while jobs[i] is not job:  # (equal arrival keys: only with equal job ids, which a queue does not hold)
        i += 1
    del jobs[i]
    if not jobs:
        del lists[name]


class Pending(Mapping):
    """Job id -> why it waits, for one cycle (see the module). Valid until the next cycle on the same queue.

    `rest`: [(jobs, start, owner)] in order, the jobs not looked at (each list from `start`; `owner` is the
    list's (priority, tenant or None)), whose places in line follow those looked at; `settled`: key -> their
    answer. A job whose answer says no node could ever hold it (`reasons.NEVER_HELD`) has no place in line and
    takes none: the places of the rest skip the jobs of such keys, found through `HeldQueue.of` (once per key a
    pass over the queue, then work in the number of such jobs, not in the length of the queue)."""

    def __init__(self) -> None:
        self.known: dict[str, Reason] = {}
        self.rest: list[tuple[list[JobRequest], int, tuple]] = []
        self.settled: dict[tuple, Blocker] = {}
        self.queue: HeldQueue | None = None
        self._offsets: list[int] = []  # each rest segment's first job: its slot (every waiting job counted)
        self._places: list[int] = []  # ... and the place in line of its first job in line
        self._skips: list[list[int]] = []  # each rest segment's jobs out of line: their indexes in its list
        self._owners: dict[tuple, int] = {}
        self._size = 0
        self._reserved: dict[str, float] = {}  # job id -> the start reserved for it (`stopped`)
        self._now = 0.0

    def stopped(
        self,
        queue: HeldQueue,
        rest: list,
        settled: dict[tuple, Blocker],
        in_line: int,
        reserved: tuple[dict[str, float], float] = ({}, 0.0),
    ) -> None:
        """The cycle stopped after looking at the jobs in `known`, `in_line` of which have a place in line;
        `reserved`: (job id -> the start reserved for it, now), the estimated starts of those among the rest."""
        self.queue, self.rest, self.settled = queue, rest, dict(settled)
        self._reserved, self._now = reserved
        self._owners = {owner: n for n, (_jobs, _start, owner) in enumerate(rest)}
        skips: list[list[int]] = [[] for _ in rest]
        for key, blocker in self.settled.items():
            if not blocker.in_line:
                for job in queue.of(key).values():
                    found = self._find(queue, job)
                    if found is not None:
                        skips[found[0]].append(found[1])
        slot, place = len(self.known) + 1, in_line + 1
        for n, (jobs, start, _owner) in enumerate(rest):
            skips[n].sort()
            self._offsets.append(slot)
            self._places.append(place)
            slot += len(jobs) - start
            place += len(jobs) - start - len(skips[n])
        self._skips = skips
        self._size = slot - 1 - len(self.known)

    # ------------------------------------------------------------------------------------------- Mapping
    def __getitem__(self, job_id: str) -> Reason:
        found = self.known.get(job_id)
        if found is not None:
            return found
        found = self._lookup(job_id)
        if found is None:
            raise KeyError(job_id)
        return found

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.known or (bool(self.rest) and self._lookup(job_id) is not None)

    def __len__(self) -> int:
        return len(self.known) + self._size

    def __iter__(self) -> Iterator[str]:
        yield from self.known
        for jobs, start, _owner in self.rest:
            for job in jobs[start:]:
                yield job.job_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Pending({len(self.known)} looked at, {self._size} settled)"

    # ------------------------------------------------------------------------------------------- in order
    def window(self, first: int, last: int) -> list[tuple[str, Reason]]:
        """(job id, reason) of the first..last waiting jobs in the cycle's order (1 = the first), in order; none
        past the end. Every waiting job counts here, those out of line too (whose reasons have no position)."""
        out: list[tuple[str, Reason]] = []
        known = len(self.known)
        if first <= known:
            items = list(self.known.items())  # (the jobs a cycle looked at: its own work, not the queue's)
            out.extend(items[first - 1 : min(last, known)])
            first = known + 1
        if first > last or not self.rest:
            return out
        n = max(0, bisect.bisect_right(self._offsets, first) - 1)
        while n < len(self.rest) and first <= last:
            jobs, start, _owner = self.rest[n]
            offset = self._offsets[n]
            i = start + first - offset
            place = self._place(n, i)
            for job in jobs[i : start + last - offset + 1]:
                blocker = self.settled[job.key]
                out.append((job.job_id, blocker.at(place, self._reserved.get(job.job_id), self._now)))
                place += blocker.in_line
                first += 1
            n += 1
        return out

    def line(self, limit: int | None = None) -> list[str]:
        """The ids of the waiting jobs that have a place in line, in the order of their places (the first is
        1st), the first `limit` of them: what the queue's line stores (`shared/stores/readmodels/queueline.py`). Work in the jobs
        listed, with no reason made."""
        return list(itertools.islice(self._in_line(), limit))

    def _in_line(self) -> Iterator[str]:
        places = sorted((r.position, job_id) for job_id, r in self.known.items() if r.position is not None)
        yield from (job_id for _, job_id in places)
        for (jobs, start, _owner), skips in zip(self.rest, self._skips, strict=True):
            skip = set(skips)
            yield from (jobs[i].job_id for i in range(start, len(jobs)) if i not in skip)

    def _place(self, n: int, i: int) -> int:
        """The place in line of the first job in line from index i of rest segment n."""
        return self._places[n] + i - self.rest[n][1] - bisect.bisect_left(self._skips[n], i)

    def _find(self, queue: HeldQueue, job: JobRequest) -> tuple[int, int] | None:
        """(rest segment, index in its list in `queue`) of a job the cycle did not look at, or None."""
        for owner in ((job.priority, job.tenant), (job.priority, None)):
            n = self._owners.get(owner)
            if n is None:
                continue
            jobs, start, _owner = self.rest[n]
            i = queue.position_in(jobs, job)
            if i is not None and i >= start:
                return n, i
        return None

    def _lookup(self, job_id) -> Reason | None:
        queue = self.queue
        if queue is None:
            return None
        job = queue.jobs.get(job_id)
        if job is None:
            return None
        found = self._find(queue, job)
        if found is None:
            return None
        return self.settled[job.key].at(self._place(*found), self._reserved.get(job_id), self._now)
