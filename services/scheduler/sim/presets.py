"""Named scheduler set-ups the simulator can compare side by side.

- "fifo": the baseline: strict arrival order (nothing passes a blocked job), first fit, no fair share, no
  preemption.
- "firstfit", "bestfit", "fgd", "gpuyard": GPUYard's scheduler (fair share, EASY backfill, preemption) with
  that placement policy. "gpuyard" is the default configuration of the core.
In inflation mode only the placement policy matters ("fifo" places like "firstfit").
"""

from __future__ import annotations

from dataclasses import replace

from services.scheduler.core.model import SchedulerConfig
from services.scheduler.core.placement import POLICIES
from shared.policies import BackfillMode, Policy

BASELINE = "fifo"


def names() -> list[str]:
    return [BASELINE, *sorted(POLICIES)]


def config_for(name: str, popularity: tuple = ()) -> SchedulerConfig:
    if name == BASELINE:
        base = SchedulerConfig(
            policy=Policy.FIRSTFIT, fair_share=False, backfill=BackfillMode.OFF, preemption=False
        )
    elif name in POLICIES:
        base = SchedulerConfig(policy=Policy(name))
    else:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(names())}")
    return replace(base, shape_popularity=popularity or None)


def placement_for(name: str) -> Policy:
    return Policy.FIRSTFIT if name == BASELINE else config_for(name).policy
