"""Nodes and their GPUs as the API shows them, and node controls (cordon, drain)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.fieldtypes import JSON_INTEGER, Strict


class NodeState(StrEnum):
    READY = "ready"
    LOST = "lost"
    CORDONED = "cordoned"
    """An admin's cordon: nothing new is placed on it, its running jobs stay."""
    DRAINING = "draining"
    """An admin's drain: cordoned, and its running jobs preempted and requeued."""


class GpuHolderOut(Out):
    """A job replica placed on a GPU (another tenant's shows only as `other`: no job, tenant or user)."""

    job_id: str | None = None
    tenant: str | None = None
    user: str | None = None
    fraction: float = Field(description="1.0 for a whole GPU, less for a share.")
    other: bool = Field(False, description="Another tenant's job (its name is not shown to you).")


class GpuOut(Out):
    index: int
    uuid: str
    model: str
    memory_bytes: int
    utilization_pct: float | None = Field(None, description="From the node's latest gpu.sample, if fresh.")
    memory_used_bytes: int | None = Field(None, description="From the node's latest gpu.sample, if fresh.")
    temperature_c: float | None = Field(None, description="From the node's latest gpu.sample, if fresh.")
    holders: list[GpuHolderOut] = Field(default_factory=list, description="From the latest gpu.sample.")
    healthy: bool = Field(
        True, description="False once its monitor saw a fatal XID, uncorrected ECC, or lost."
    )
    unhealthy_reason: str | None = None
    cordoned: bool = Field(False, description="Cordoned or drained on its own, or with its node.")


class NodeOut(Out):
    node: str
    state: NodeState = Field(
        description="ready; lost (the scheduler gave up on its heartbeat); cordoned or draining (an admin's)"
    )
    reason: str = Field("", description="The reason given with the node's last cordon, drain or uncordon.")
    last_seen_seconds_ago: float
    gpus: list[GpuOut]
    cpus: float
    memory_bytes: int
    simulated: bool
    sampled_seconds_ago: float | None = Field(
        None,
        description="Age of the node's latest gpu.sample (None: none fresh); GPUs' live figures from it.",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What the node's engine says of it (its heartbeat's notes): GPUs held by work outside "
        "GPUYARD, or why the engine places nothing on it.",
    )


class NodeControlIn(Strict):
    """`POST /v1/nodes/{node}/cordon|drain|uncordon`: the whole node, or one GPU of it."""

    gpu: Annotated[int, Field(ge=0, le=1023), JSON_INTEGER] | None = Field(
        None, description="One GPU of the node (its index)."
    )
    reason: str = Field("", max_length=500)


class NodeControlOut(Out):
    """A node's cordons and unhealthy GPUs after the change."""

    node: str
    cordoned: bool
    draining: bool
    reason: str = ""
    by: str = ""
    cordoned_gpus: list[int] = Field(default_factory=list)
    draining_gpus: list[int] = Field(default_factory=list)
    unhealthy_gpus: dict[int, str] = Field(default_factory=dict, description="GPU index -> why.")
