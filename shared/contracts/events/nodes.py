"""The events of nodes and their GPUs: heartbeats, loss, GPU health, node controls (cordon, drain), GPU samples."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.shared.contracts.events.envelope import EventData, event, upcaster
from gpuyard.shared.contracts.events.subjects import Subject


class GpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    index: int
    uuid: str
    model: str
    memory_bytes: int


MAX_ANNOUNCED_ENVIRONMENTS = 64
"""The most environments a heartbeat lists (the most recently used): a heartbeat stays small."""


class NodeEnvironment(BaseModel):
    """A job environment a node holds (docs/environments.md), as its heartbeat announces it."""

    model_config = ConfigDict(frozen=True)
    key: str = Field(..., description="Its content hash (python, packages, the builder's index).")
    python: str = Field(..., description='Its Python version, major.minor ("3.11").')
    packages: str = Field("", description="Its packages in a few words: 'numpy, torch==2.13.0 and 3 more'.")
    package_count: int = 0
    size_bytes: int = 0
    last_used: datetime | None = None
    in_use: int = Field(0, ge=0, description="Running replicas on the node that use it.")


@event(Subject.NODE_HEARTBEAT)
class NodeHeartbeat(EventData):
    node: str
    gpus: list[GpuInfo]
    cpus: float
    memory_bytes: int
    simulated: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(
        default_factory=list,
        description="What the node's engine says of it that its figures do not (`gpuyard nodes` prints them): GPUs "
        "held by work outside GPUYARD, or why the engine places nothing on it (Slurm: a DOWN or DRAINED node).",
    )
    interval_seconds: float = 5.0
    gateway: str = Field(
        "",
        description="The base URL of the node's executor gateway (exec, shell, ports: docs/access.md), which the "
        "submit service reaches with the platform's gateway token; empty where the node has none.",
    )
    pythons: list[str] = Field(
        default_factory=list,
        description='The Python versions the node builds job environments for ("3.11"); empty: none (a '
        "Kubernetes node, or no system interpreter).",
    )
    environments: list[NodeEnvironment] = Field(
        default_factory=list,
        description=f"The job environments the node holds, the most recently used first (at most "
        f"{MAX_ANNOUNCED_ENVIRONMENTS}).",
    )


@event(Subject.NODE_LOST)
class NodeLost(EventData):
    node: str
    last_seen: datetime
    message: str = ""


@event(Subject.NODE_GPU_HEALTH)
class GpuHealthChanged(EventData):
    """A GPU's health as its node's monitor judges it from its own samples: unhealthy after a fatal XID, an
    uncorrected ECC error or the GPU lost (`services/monitor/health.py`). Only an admin's uncordon makes it
    healthy again (a `node.control`): the monitor never publishes `healthy: true` on its own."""

    node: str
    index: int = Field(..., ge=0)
    uuid: str = ""
    healthy: bool = False
    reason: str = Field(..., description="Why, for machines: xid, ecc_uncorrected, lost.")
    message: str = Field("", description="Why, for people (the XID code, the error count).")
    xid: int | None = None


@event(Subject.NODE_ENVIRONMENT_REMOVE)
class EnvironmentRemoveRequested(EventData):
    """An admin removes a job environment from a node (`gpuyard envs rm KEY`): its executor deletes it, unless a
    running replica uses it (said in its log). Idempotent: an environment already gone is nothing to do."""

    node: str = Field(..., description="The node that holds it.")
    key: str = Field(..., pattern=r"^[0-9a-f]{1,64}$", description="The environment's key (`gpuyard envs`).")
    by: str = Field("", description="Who asked (the admin's name).")


class NodeAction(StrEnum):
    CORDON = "cordon"
    DRAIN = "drain"
    UNCORDON = "uncordon"


@event(Subject.NODE_CONTROL)
class NodeControlChanged(EventData):
    """An admin cordoned, drained or uncordoned a node, or one GPU of it (`gpu` set). Cordon: nothing new is
    placed there, running jobs stay. Drain: a cordon, and the running jobs there are stopped like preempted
    ones and requeued. Uncordon: both undone, and an unhealthy mark cleared."""

    node: str
    gpu: int | None = Field(None, ge=0, description="One GPU of the node (its index); None: the whole node.")
    action: NodeAction
    by: str = Field("", description="Who asked (the admin's name).")
    reason: str = ""


class GpuProcessUse(BaseModel):
    """One process on a GPU, as NVML reports it."""

    model_config = ConfigDict(frozen=True)
    pid: int
    used_bytes: int | None = Field(None, description="Its GPU memory (None where the driver cannot say).")


class GpuHolder(BaseModel):
    """A job replica that holds a GPU, or a share of it, on the node."""

    model_config = ConfigDict(frozen=True)
    job_id: str
    tenant: str
    user: str = ""
    replica: int = 0
    fraction: float = Field(1.0, gt=0, le=1, description="1.0 for a whole GPU, less for a share.")
    memory_bytes: int | None = Field(None, description="The memory slice of a share.")


class GpuReading(BaseModel):
    """One GPU's figures at one moment. A figure the GPU or its driver does not report is None (all of them
    but the GPU's identity when it is `lost`)."""

    model_config = ConfigDict(frozen=True)
    index: int
    uuid: str
    model: str = ""
    pci_bus_id: str = ""
    utilization_pct: float | None = Field(
        None, description="GPU (SM) utilization, percent: DCGM_FI_DEV_GPU_UTIL."
    )
    memory_util_pct: float | None = Field(
        None, description="Memory copy utilization, percent: DCGM_FI_DEV_MEM_COPY_UTIL."
    )
    memory_used_bytes: int | None = Field(None, description="DCGM_FI_DEV_FB_USED (in bytes here).")
    memory_total_bytes: int = 0
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    ecc_corrected: int | None = Field(None, description="Corrected ECC errors since the driver loaded.")
    ecc_uncorrected: int | None = Field(None, description="Uncorrected ECC errors since the driver loaded.")
    xids: list[int] = Field(
        default_factory=list, description="XID errors the driver reported since the previous sample."
    )
    last_xid: int | None = Field(None, description="The last XID error seen: DCGM_FI_DEV_XID_ERRORS.")
    lost: bool = Field(False, description="NVML reports the GPU lost (fallen off the bus).")
    processes: list[GpuProcessUse] = Field(default_factory=list)
    holders: list[GpuHolder] = Field(default_factory=list, description="The job replicas placed on it.")


@event(Subject.GPU_SAMPLE, version=2)
class GpuSample(EventData):
    """Every GPU of one node at one moment, published by the node's monitor every `sample_interval`."""

    node: str
    gpus: list[GpuReading]
    simulated: bool = Field(
        False, description="Virtual GPUs (`--simulate-gpus`): utilization is the holder's CPU use."
    )
    interval_seconds: float = Field(1.0, gt=0, description="Seconds between this node's samples.")


@upcaster(Subject.GPU_SAMPLE, from_version=1)
def _gpu_sample_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 was one GPU per event."""
    reading = {k: v for k, v in data.items() if k not in ("node", "simulated")}
    return {"node": data.get("node"), "simulated": data.get("simulated", False), "gpus": [reading]}
