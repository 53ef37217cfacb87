"""What one replica of a job asks for, normalised for the placement code (milli-GPU shares, plain numbers)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuyard.shared.scheduling.model import JobRequest

MILLI = 1000  # a whole GPU, in thousandths


def share_to_milli(fraction: float) -> int:
    """A requested share in thousandths of a GPU, rounded up so that shares never over-allocate a GPU."""
    if fraction <= 0:
        return 0
    return min(MILLI, max(1, math.ceil(fraction * MILLI - 1e-6)))


def used_to_milli(allocated: float) -> int:
    """The thousandths of a GPU in use, rounded up (a GPU 99.95% used has no room for a 0.001 share)."""
    return min(MILLI, max(0, math.ceil(allocated * MILLI - 1e-6)))


@dataclass(frozen=True, slots=True)
class Demand:
    """One replica: `count` GPUs of `milli` thousandths each (count 0 = CPU only), plus CPUs and memory.

    A whole-GPU replica has milli == 1000; a share has count == 1 and milli < 1000 (or == 1000 for a share
    rounded up to a whole GPU, which then needs an idle GPU just like a whole one).
    """

    count: int
    milli: int
    cpus: float
    memory: float
    gpu_memory: float  # share: the memory slice; whole GPUs: the least memory each GPU must have; 0 = none
    models: tuple[str, ...]
    fraction: float  # the requested share as given (for GpuAssignment.fraction); 1.0 for whole GPUs
    whole: bool = field(init=False, compare=False, repr=False)  # milli == MILLI (read on every placement)

    def __post_init__(self) -> None:
        object.__setattr__(self, "whole", self.milli == MILLI)

    @property
    def total_milli(self) -> int:
        return self.count * self.milli


def demand_of(job: JobRequest) -> Demand:
    gpus = job.gpus
    models = tuple(sorted(set(job.gpu_models)))
    gpu_memory = float(job.gpu_memory or 0)
    if gpus <= 0:
        return Demand(0, 0, float(job.cpus), float(job.memory), 0.0, models, 0.0)
    if gpus >= 1:
        return Demand(
            math.ceil(gpus - 1e-9), MILLI, float(job.cpus), float(job.memory), gpu_memory, models, 1.0
        )
    return Demand(
        1, share_to_milli(gpus), float(job.cpus), float(job.memory), gpu_memory, models, float(gpus)
    )


def shape_key(job: JobRequest) -> tuple:
    """Jobs with the same key fit exactly the same places: one failed fit answers for all of them."""
    return job.key[:6] if not job.python else (*job.key[:6], job.python)
