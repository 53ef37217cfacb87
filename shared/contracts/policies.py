"""Names of the scheduler's choices that settings, the CLI, the API and the docs share: placement policies and
backfill modes. The scheduler core maps each name to its implementation."""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    """Where a job goes among the nodes and GPUs that could hold it."""

    GPUYARD = "gpuyard"
    """GPUYard's own: FGD's fragmentation plus CPU stranding, GPU-model scarcity and packing (the default)."""
    FGD = "fgd"
    """Fragmentation Gradient Descent (Weng et al., USENIX ATC '23)."""
    BESTFIT = "bestfit"
    """The node with the least CPU and GPU left after the job (the FGD paper's baseline)."""
    FIRSTFIT = "firstfit"
    """The first node and GPUs that fit, in order."""


class BackfillMode(StrEnum):
    """Whether and how a job may start ahead of a job that waits for resources."""

    EASY = "easy"
    """The first blocked job gets a reservation from the running jobs' time limits; later jobs start only if
    they do not delay it (the default)."""
    GREEDY = "greedy"
    """Anything that fits starts."""
    OFF = "off"
    """Strict order: nothing passes a blocked job."""
