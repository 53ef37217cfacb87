"""Who holds what: per-tenant and per-user usage, guaranteed quotas, borrowing, DRF dominant shares.

Quotas (`ClusterState.quotas`, tenant -> guaranteed GPUs) work like one Kueue cohort: a tenant may always run up
to its guarantee; above it, it borrows idle GPUs (when `SchedulerConfig.borrowing`), and borrowed work is the
first to be preempted when an owner needs its guarantee back. Which of a tenant's jobs count as borrowed is
recomputed every cycle: its jobs in (priority high first, oldest first) order fill the guarantee, the rest are
borrowed. An empty quota dict switches all of this off.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from operator import attrgetter

from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.contracts.units import count_text
from gpuyard.shared.scheduling import reasons as R
from gpuyard.shared.scheduling.model import EPS, Allocation, JobRequest, SchedulerConfig

_JOB = attrgetter("job")
_KIND = attrgetter("tenant", "user", "key")


class RunningKinds:
    """The running jobs counted by kind ((tenant, user, `JobRequest.key`)): tenant usage (`QuotaLedger`), shape
    popularity (`popularity.popularity_for`) and the lowest running priority all read it. Counted at C level on
    first use, or kept up to date job by job (`add`) by a caller that holds the running jobs between cycles."""

    __slots__ = ("running", "_counts")

    def __init__(self, running: Sequence[Allocation] = ()) -> None:
        self.running = running
        self._counts: Counter | None = None

    @property
    def counts(self) -> Counter:
        if self._counts is None:
            self._counts = Counter(map(_KIND, map(_JOB, self.running)))
        return self._counts

    def add(self, job: JobRequest, n: int = 1) -> None:
        counts = self.counts
        kind = _KIND(job)
        counts[kind] += n
        if not counts[kind]:
            del counts[kind]

    def lowest_priority(self) -> int | None:
        return min((key[6] for _tenant, _user, key in self.counts), default=None)


class QuotaLedger:
    def __init__(
        self,
        quotas: dict[str, float],
        running: list[Allocation],
        config: SchedulerConfig,
        capacity: tuple[float, float, float],
        kinds: RunningKinds | None = None,
    ) -> None:
        self.quotas = quotas
        self.config = config
        self.capacity = tuple(c if c > 0 else 1.0 for c in capacity)  # GPUs, CPUs, memory
        self.gpus: dict[str, float] = defaultdict(float)
        self.cpus: dict[str, float] = defaultdict(float)
        self.memory: dict[str, float] = defaultdict(float)
        self.user_gpus: dict[tuple[str, str], float] = defaultdict(float)
        self.caps_on = bool(config.user_gpu_cap)
        # counted on first use: a cycle with one tenant and no quotas never needs it
        self._running: list[Allocation] | None = running
        self._kinds = kinds if kinds is not None else RunningKinds(running)
        self._pending: list[tuple[JobRequest, float]] = []
        self.version = 0  # bumped by every `add` (what fair-share ordering compares)
        self.quotas_on = bool(quotas)

    def _count(self) -> None:
        self._running = None
        # alike running jobs are counted together (C-level), then added once per kind, in a fixed order (the
        # sums do not depend on the order the jobs are listed in)
        for (tenant, user, key), n in sorted(self._kinds.counts.items()):
            gpus, replicas, cpus, memory = key[:4]
            self.gpus[tenant] += gpus * replicas * n
            self.cpus[tenant] += cpus * replicas * n
            self.memory[tenant] += memory * replicas * n
            if self.caps_on:
                self.user_gpus[(tenant, user)] += gpus * replicas * n
        for job, sign in self._pending:
            self._add(job, sign)
        self._pending = []

    def add(self, job: JobRequest, sign: float = 1.0) -> None:
        self.version += 1
        if self._running is not None:
            self._pending.append((job, sign))
        else:
            self._add(job, sign)

    def _add(self, job: JobRequest, sign: float) -> None:
        gpus = job.total_gpus * sign
        self.gpus[job.tenant] += gpus
        self.cpus[job.tenant] += job.cpus * job.replicas * sign
        self.memory[job.tenant] += job.memory * job.replicas * sign
        if self.caps_on:
            self.user_gpus[(job.tenant, job.user)] += gpus

    def guarantee(self, tenant: str) -> float:
        return float(self.quotas.get(tenant, 0.0))

    def used(self, tenant: str) -> float:
        if self._running is not None:
            self._count()
        return self.gpus[tenant]

    def would_borrow(self, job: JobRequest) -> bool:
        return self.quotas_on and self.used(job.tenant) + job.total_gpus > self.guarantee(job.tenant) + EPS

    def dominant_share(self, tenant: str) -> float:
        if self._running is not None:
            self._count()
        g, c, m = self.capacity
        share = max(self.gpus[tenant] / g, self.cpus[tenant] / c, self.memory[tenant] / m)
        return share / self.config.tenant_weights.get(tenant, 1.0)

    def user_cap(self, tenant: str) -> float | None:
        caps = self.config.user_gpu_cap
        return caps.get(tenant, caps.get("*"))

    def admission_blocker(self, job: JobRequest) -> R.Blocker | None:
        """Quota and user-cap rules that stop the job whatever the free capacity (None = may go ahead)."""
        if self.caps_on and job.total_gpus > 0:
            if self._running is not None:
                self._count()
            cap = self.user_cap(job.tenant)
            held = self.user_gpus[(job.tenant, job.user)]
            if cap is not None and held + job.total_gpus > cap + EPS:
                return R.Blocker(
                    PendingCode.USER_CAP,
                    f"user {job.user or '(none)'} of tenant {job.tenant} holds {held:g} of at most {count_text(cap, 'GPU')}; "
                    f"this job needs {job.total_gpus:g} more",
                    {
                        "user": job.user,
                        "tenant": job.tenant,
                        "held": held,
                        "cap": cap,
                        "needed": job.total_gpus,
                    },
                )
        if self.would_borrow(job) and not self.config.borrowing:
            return R.Blocker(
                PendingCode.BORROWING_DISABLED,
                f"tenant {job.tenant} is at its quota {self.used(job.tenant):g}/{count_text(self.guarantee(job.tenant), 'GPU')} "
                f"and borrowing is off",
                {"tenant": job.tenant, "used": self.used(job.tenant), "quota": self.guarantee(job.tenant)},
            )
        return None

    def quota_blocker(self, job: JobRequest) -> R.Blocker:
        """A borrowing job that found no idle room."""
        used, quota = self.used(job.tenant), self.guarantee(job.tenant)
        return R.Blocker(
            PendingCode.QUOTA_EXHAUSTED,
            f"tenant {job.tenant} is at its quota {used:g}/{count_text(quota, 'GPU')} and no idle GPUs can be borrowed "
            f"(needs {job.total_gpus:g})",
            {"tenant": job.tenant, "used": used, "quota": quota, "needed": job.total_gpus},
        )


def borrowed_jobs(running: list[Allocation], quotas: dict[str, float]) -> set[str]:
    """Job ids running above their tenant's guarantee (the reclaimable ones)."""
    if not quotas:
        return set()
    by_tenant: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in running:
        by_tenant[alloc.job.tenant].append(alloc)
    out: set[str] = set()
    for tenant, allocs in by_tenant.items():
        room = float(quotas.get(tenant, 0.0))
        for alloc in sorted(allocs, key=lambda a: (-a.job.priority, a.started_at, a.job.job_id)):
            room -= alloc.job.total_gpus
            if room < -EPS:
                out.add(alloc.job.job_id)
    return out
