"""The waiting jobs as a caller keeps them between cycles, in the order a cycle considers them, and the reasons
of a cycle as a mapping that computes most of them when read.

A `HeldQueue` is told what changed (`put`, `drop`); the changes are applied at the next cycle (`prepare`), so
what a cycle answered about the queue stays valid until the next one. It keeps, per priority class, the jobs
in arrival order (submitted_at, then job id) and, per class and tenant, the tenant's own jobs in that order:
the order of `ordering.in_order` without sorting the whole queue every cycle. It also counts the jobs per
`JobRequest.key` (shape popularity, and what a cycle still has to look at) and keeps the jobs with a retry
backoff apart.

`Pending` is `CycleResult.pending`: a mapping job id -> `Reason`. The jobs a cycle looked at are in it
explicitly; when every job left in the order would get its shape's settled answer (a full cluster, a long
queue of alike jobs), the cycle stops there, and the rest of the reasons are `Blocker.at(position)` of the
settled answers, computed when read (a job's position by bisection in its tenant's list).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from operator import attrgetter

from services.scheduler.core.model import JobRequest
from services.scheduler.core.reasons import Blocker, Reason

ARRIVAL = attrgetter("submitted_at", "job_id")  # the order inside a priority class (and a tenant)
_BULK = 32  # more new jobs than this for one list: appended and sorted once, not inserted one by one


class HeldQueue:
    def __init__(self, jobs: Iterable[JobRequest] = ()) -> None:
        self.jobs: dict[str, JobRequest] = {}
        self.keys: Counter = Counter()  # JobRequest.key -> waiting jobs (in the order first put)
        self.backoff: dict[str, JobRequest] = {}  # the jobs with a not_before
        self.classes: dict[int, list[JobRequest]] = {}  # priority -> its jobs in arrival order
        self.tenants: dict[int, dict[str, list[JobRequest]]] = {}  # priority -> tenant -> its jobs, likewise
        self._changes: dict[str, JobRequest | None] = {}
        for job in jobs:
            self.put(job)
        self.prepare()

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
        for job_id, job in changes.items():
            old = self.jobs.get(job_id)
            if old is not None:
                if old is job or old == job:
                    continue  # (the same request: it keeps its place, and the object a cycle answered for)
                self._remove(old)
            if job is not None:
                self.jobs[job_id] = job
                self.keys[job.key] += 1
                if job.not_before is not None:
                    self.backoff[job_id] = job
                added.setdefault((job.priority, None), []).append(job)
                added.setdefault((job.priority, job.tenant), []).append(job)
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
                target.extend(jobs)
                target.sort(key=ARRIVAL)
            else:
                for job in jobs:
                    bisect.insort(target, job, key=ARRIVAL)

    def _remove(self, job: JobRequest) -> None:
        del self.jobs[job.job_id]
        self.backoff.pop(job.job_id, None)
        self.keys[job.key] -= 1
        if not self.keys[job.key]:
            del self.keys[job.key]
        _take(self.classes, job.priority, job)
        by_tenant = self.tenants[job.priority]
        _take(by_tenant, job.tenant, job)
        if not by_tenant:
            del self.tenants[job.priority]

    def position_in(self, jobs: list[JobRequest], job: JobRequest) -> int | None:
        """Where `job` is in `jobs` (one of this queue's lists), or None."""
        i = bisect.bisect_left(jobs, ARRIVAL(job), key=ARRIVAL)
        return i if i < len(jobs) and jobs[i] is job else None


def _take(lists: dict, name, job: JobRequest) -> None:
    jobs = lists[name]
    i = bisect.bisect_left(jobs, ARRIVAL(job), key=ARRIVAL)
    while jobs[i] is not job:  # (equal arrival keys: only with equal job ids, which a queue does not hold)
        i += 1
    del jobs[i]
    if not jobs:
        del lists[name]


class Pending(Mapping):
    """Job id -> why it waits, for one cycle (see the module). Valid until the next cycle on the same queue.

    `rest`: [(jobs, start, owner)] in order, the jobs not looked at (each list from `start`; `owner` is the
    list's (priority, tenant or None)), whose positions follow those looked at; `settled`: key -> their
    answer."""

    def __init__(self) -> None:
        self.known: dict[str, Reason] = {}
        self.rest: list[tuple[list[JobRequest], int, tuple]] = []
        self.settled: dict[tuple, Blocker] = {}
        self.queue: HeldQueue | None = None
        self._offsets: list[int] = []  # position of each rest segment's first job
        self._owners: dict[tuple, int] = {}
        self._size = 0

    def stopped(self, queue: HeldQueue, rest: list, settled: dict[tuple, Blocker]) -> None:
        self.queue, self.rest, self.settled = queue, rest, dict(settled)
        position = len(self.known) + 1
        for n, (jobs, start, owner) in enumerate(rest):
            self._offsets.append(position)
            self._owners[owner] = n
            position += len(jobs) - start
        self._size = position - 1 - len(self.known)

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

    # ------------------------------------------------------------------------------------------- by position
    def window(self, first: int, last: int) -> list[tuple[str, Reason]]:
        """(job id, reason) of the jobs in positions first..last (1 = next), in order; none past the end."""
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
            for job in jobs[i : start + last - offset + 1]:
                out.append((job.job_id, self.settled[job.key].at(first)))
                first += 1
            n += 1
        return out

    def _lookup(self, job_id) -> Reason | None:
        job = self.queue.jobs.get(job_id) if self.queue is not None else None
        if job is None:
            return None
        for owner in ((job.priority, job.tenant), (job.priority, None)):
            n = self._owners.get(owner)
            if n is None:
                continue
            jobs, start, _owner = self.rest[n]
            i = self.queue.position_in(jobs, job)
            if i is not None and i >= start:
                return self.settled[job.key].at(self._offsets[n] + i - start)
        return None
