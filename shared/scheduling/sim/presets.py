"""Named scheduler set-ups the simulator can compare side by side.

- "fifo": the baseline: strict arrival order (nothing passes a blocked job), first fit, no fair share, no
  preemption, any node that fits (no scarce nodes kept).
- "fifo-backfill": arrival order with classic EASY backfill (one reservation, for the first blocked job),
  first fit, no fair share, no preemption, any node that fits.
- "firstfit", "bestfit", "fgd", "gpuyard": GPUYard's scheduler (fair share, EASY backfill with its reservation
  depth, preemption, scarce nodes kept for the jobs that fit only there) with that placement policy. "gpuyard"
  is the default configuration of the core.
In inflation mode only the placement policy matters ("fifo" and "fifo-backfill" place like "firstfit").
"""

from __future__ import annotations

from dataclasses import replace

from gpuyard.shared.contracts.policies import BackfillMode, Policy
from gpuyard.shared.scheduling.model import SchedulerConfig
from gpuyard.shared.scheduling.placement import POLICIES

BASELINE = "fifo"
FIFO_BACKFILL = "fifo-backfill"


def names() -> list[str]:
    return [BASELINE, FIFO_BACKFILL, *sorted(POLICIES)]


def config_for(name: str, popularity: tuple = ()) -> SchedulerConfig:
    if name == BASELINE:
        base = SchedulerConfig(
            policy=Policy.FIRSTFIT,
            fair_share=False,
            backfill=BackfillMode.OFF,
            preemption=False,
            keep_scarce_nodes=False,
            short_first_window=0.0,
        )
    elif name == FIFO_BACKFILL:
        base = SchedulerConfig(
            policy=Policy.FIRSTFIT,
            fair_share=False,
            backfill=BackfillMode.EASY,
            reservation_depth=1,
            preemption=False,
            keep_scarce_nodes=False,
            short_first_window=0.0,
        )
    elif name in POLICIES and name != Policy.GPUYARD:
        # GPUYard's queueing as docs/benchmarks.md measured it (arrival order), with that placement policy
        base = SchedulerConfig(policy=Policy(name), short_first_window=0.0)
    elif name in POLICIES:
        base = SchedulerConfig(policy=Policy(name))
    else:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(names())}")
    return replace(base, shape_popularity=popularity or None)


def placement_for(name: str) -> Policy:
    return config_for(name).policy
