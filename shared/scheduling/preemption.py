"""Choosing victims: the fewest, cheapest running jobs whose removal lets a waiting job fit.

Who may be preempted by job J (and only if it has run at least `min_runtime_before_preemption` seconds):
- no quotas: any job with a lower priority than J;
- with quotas: J's own tenant's jobs with lower priority; other tenants' BORROWED jobs with lower priority;
  and, when J stays within its tenant's guarantee (a reclaim), other tenants' borrowed jobs of any priority.
Candidates are tried in this order: borrowed first, lower priority first, least work lost first, then fewer
GPUs, then job id. The work a victim loses is what it did since its latest checkpoint of the current attempt
(`Allocation.checkpointed_at`), or since its start without one (`lost_work`): with no checkpoints anywhere,
the youngest goes first. They are released one by one on a copy of the capacity until J fits (all replicas);
then, in reverse order, every victim J does not actually need is put back (Kueue's approach).
The core only decides (each `Preemption` says how much work its victim loses); the service sends
`job.preempted` with a grace period and that figure, and requeues the victims.
"""

from __future__ import annotations

from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.gang import place_gang, undo_gang
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import Allocation, JobRequest, SchedulerConfig
from gpuyard.shared.scheduling.placement.base import PlacementPolicy


def work_began(alloc: Allocation, now: float) -> float:
    """When the work `alloc` would lose began: its latest checkpoint (one from the future counts as now), or its
    start when it has none or saved it before this attempt started."""
    saved = alloc.checkpointed_at
    if saved is None:
        return alloc.started_at
    return max(alloc.started_at, min(saved, now))


def lost_work(alloc: Allocation, now: float) -> float:
    """Seconds of work `alloc` loses if it is stopped at `now` (never below 0)."""
    return max(0.0, now - work_began(alloc, now))


def eligible_victims(
    job: JobRequest,
    running: list[Allocation],
    borrowed: set[str],
    quotas_on: bool,
    reclaim: bool,
    config: SchedulerConfig,
    now: float,
    taken: set[str],
) -> list[Allocation]:
    out = []
    for alloc in running:
        other = alloc.job
        if other.job_id in taken or now - alloc.started_at < config.min_runtime_before_preemption:
            continue
        lower = other.priority < job.priority
        if not quotas_on or other.tenant == job.tenant:
            ok = lower
        else:
            ok = other.job_id in borrowed and (lower or reclaim)
        if ok:
            out.append(alloc)
    out.sort(
        key=lambda a: (
            a.job.job_id not in borrowed,
            a.job.priority,
            -work_began(a, now),  # least work lost first (the youngest, without checkpoints)
            a.job.total_gpus,
            a.job.job_id,
        )
    )
    return out


def _fits(index: CapacityIndex, policy: PlacementPolicy, demand: Demand, replicas: int) -> bool:
    if not index.candidates(demand).size:
        return False
    taken = place_gang(index, policy, demand, replicas)
    if taken is None:
        return False
    undo_gang(index, demand, taken)
    return True


def choose_victims(
    index: CapacityIndex,
    policy: PlacementPolicy,
    demand: Demand,
    replicas: int,
    candidates: list[Allocation],
) -> list[Allocation] | None:
    """The victims to preempt so that the gang fits, or None when even all candidates are not enough."""
    if not candidates:
        return None
    trial = index.copy()
    chosen: list[Allocation] = []
    for alloc in candidates:
        trial.release(alloc.replicas)
        chosen.append(alloc)
        if _fits(trial, policy, demand, replicas):
            break
    else:
        return None
    needed: list[Allocation] = []
    for alloc in reversed(chosen[:-1]):  # the last one was needed to make it fit
        trial.occupy(alloc.replicas)
        if not _fits(trial, policy, demand, replicas):
            trial.release(alloc.replicas)
            needed.append(alloc)
    needed.append(chosen[-1])
    return sorted(needed, key=lambda a: a.job.job_id)
