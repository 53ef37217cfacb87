"""What a tenant's live jobs hold of the GPUs: one definition of its used and borrowed GPUs, for the monitor's
/metrics (`services/monitor/platform.py`) and the API's `GET /v1/tenants` (`services/submit/routes_tenants.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpuyard.shared.contracts.events.jobs import ReplicaPlacement

DIGITS = 6
"""Sums of fractions rounded to this many decimals (0.1 + 0.2 is 0.3, not 0.30000000000000004)."""


def held_gpus(placements: Iterable[ReplicaPlacement]) -> float:
    """The GPUs a job's placement holds (a share of a GPU counted as its fraction)."""
    return sum(g.fraction for p in placements for g in p.gpus)


@dataclass(frozen=True, slots=True)
class Holding:
    """One placed or running job, as the quota sees it."""

    tenant: str
    gpus: float
    """What its placement holds (`held_gpus`)."""
    borrowed: bool
    """Placed on another tenant's idle quota (the scheduler's word, `JobPlaced.borrowed`)."""


@dataclass(frozen=True, slots=True)
class QuotaUse:
    used: float
    """GPUs the tenant's placed and running jobs hold."""
    borrowed: float
    """Of those, the GPUs of its jobs placed on another tenant's idle quota (the first to be preempted)."""


NOTHING = QuotaUse(0.0, 0.0)
"""A tenant's use with no job placed or running."""


def quota_use(holdings: Iterable[Holding]) -> dict[str, QuotaUse]:
    """Tenant -> its used and borrowed GPUs, from its placed and running jobs (tenants with none left out)."""
    used: defaultdict[str, float] = defaultdict(float)
    borrowed: defaultdict[str, float] = defaultdict(float)
    for h in holdings:
        used[h.tenant] += h.gpus
        if h.borrowed:
            borrowed[h.tenant] += h.gpus
    return {t: QuotaUse(round(used[t], DIGITS), round(borrowed.get(t, 0.0), DIGITS)) for t in used}
