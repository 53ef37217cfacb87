"""The scheduler's settings: the cycle, the policy and its knobs."""

from __future__ import annotations

from pydantic import Field

from gpuyard.shared.contracts.policies import BackfillMode, Policy
from gpuyard.shared.settings.common import CommonSettings, TenantNumbers


class SchedulerSettings(CommonSettings):
    """The scheduler."""

    policy: Policy = Field(
        Policy.GPUYARD, description=f"Placement policy: {', '.join(Policy)} (see docs/scheduler.md)."
    )
    cycle_interval: float = Field(
        1.0, description="Seconds between timer-driven cycles (events also trigger one)."
    )
    node_timeout: float = Field(
        30.0, description="Seconds without a heartbeat before a node is lost and its jobs requeued."
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, `vision=8,nlp=4` or a JSON object; empty: no quotas (one "
        "shared pool).",
    )
    tenant_weights: TenantNumbers = Field(
        default_factory=dict,
        description="Fair-share weight per tenant inside a priority class, `vision=2`; 1 for a tenant not named.",
    )
    user_gpu_cap: TenantNumbers = Field(
        default_factory=dict,
        description="Most GPUs one user of a tenant may hold, `vision=4`; `*=4` for every tenant.",
    )
    fair_share: bool = Field(
        True, description="Fair share across tenants inside a priority class; false: arrival order."
    )
    borrowing: bool = Field(
        True, description="A tenant may run above its quota on idle GPUs; that work is reclaimed first."
    )
    preemption: bool = Field(True, description="Higher priority and quota reclaims may preempt running jobs.")
    min_runtime_before_preemption: float = Field(
        300.0, description="Seconds a job runs before it may be preempted (no thrashing)."
    )
    preemption_grace: float = Field(
        30.0, description="Seconds a preempted job gets between SIGTERM and SIGKILL."
    )
    backfill: BackfillMode = Field(
        BackfillMode.EASY,
        description="easy (never delays the reservations of the oldest waiting jobs: reservation_depth, shape_reservations), greedy or off (strict order).",
    )
    reservation_depth: int = Field(
        8,
        ge=1,
        description="With easy backfill, how many jobs get a reservation that later jobs may not delay: the "
        "oldest waiting ones (with short_first_window 0: the first blocked on resources in line; 1: classic "
        "EASY).",
    )
    short_first_window: float = Field(
        3600.0,
        ge=0,
        description="Seconds: a job's place in line is its arrival plus its time limit, at most this (a short "
        "job passes longer ones that came shortly before it, never one that has waited this long); the "
        "reservations then go to the oldest waiting jobs; 0: arrival order, reservations for the first blocked "
        "jobs in line.",
    )
    shape_reservations: int = Field(
        2,
        ge=0,
        description="With a short-first window, how many of the oldest waiting jobs of each shape (GPUs per "
        "replica, GPU models, replicas, the nodes that could hold one) get a reservation besides the "
        "reservation_depth oldest: a job of a rare shape is protected while it is young; 0: none.",
    )
    pending_after: float = Field(
        5.0,
        description="Seconds a job that only waits its turn for busy resources waits before the scheduler "
        "stores why (a burst of jobs placed within it writes no reasons); a reason that says it cannot run soon "
        "(too_large, quota_exhausted…) or that it preempts is stored at once; 0: every reason at once.",
    )
    lease_ttl: float = Field(
        10.0, ge=1, description="Seconds a leader's lease lasts; another replica takes over after it lapses."
    )
    resync_interval: float = Field(
        30.0,
        description="Seconds between checks of every live job's version against the event store (the jobs that "
        "differ are read again).",
    )
