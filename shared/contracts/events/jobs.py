"""The events of a job's life: submitted, pending (with its reason), placed, started, replicas' exits, its end, cancel, preemption, requeue."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.shared.contracts.events.envelope import EventData, event
from gpuyard.shared.contracts.events.subjects import HOLDER_EXECUTOR, HOLDER_SERVING, Subject
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.reasons import PendingCode


class GpuShare(BaseModel):
    model_config = ConfigDict(frozen=True)
    index: int = Field(..., description="GPU index on the node.")
    uuid: str | None = Field(None, description="NVML UUID when known (GPU-…); used for CUDA_VISIBLE_DEVICES.")
    fraction: float = Field(1.0, gt=0, le=1, description="1.0 for a whole GPU, less for a shared one.")
    memory_bytes: int | None = Field(None, description="Memory slice of a shared GPU.")


class ReplicaPlacement(BaseModel):
    model_config = ConfigDict(frozen=True)
    replica: int
    node: str
    gpus: list[GpuShare] = Field(default_factory=list)
    cpus: float = 0
    memory_bytes: int = 0


class PendingReason(BaseModel):
    """Why a job waits: a short code for machines, a sentence with numbers for people, the numbers themselves."""

    model_config = ConfigDict(frozen=True)
    code: PendingCode = Field(..., description="Why, for machines: one of the pending reason codes.")
    message: str = Field(
        description="The sentence with its numbers, the place in line and the estimate then."
    )
    text: str = Field(
        "",
        description="The sentence alone: the API renders the message again with the job's place in line now "
        "(a new `job.pending` comes when the reason or the estimate changes, not when only the place does).",
    )
    details: dict[str, Any] = Field(default_factory=dict)
    position: int | None = Field(
        None, description="1-based place in the queue among waiting jobs, when the reason was given."
    )
    estimated_start: datetime | None = None


class FailureReason(StrEnum):
    EXIT_CODE = "exit_code"
    SIGNAL = "signal"
    START_FAILED = "start_failed"
    COMMAND_NOT_FOUND = "command_not_found"
    OOM_KILLED = "oom_killed"
    CUDA_OOM = "cuda_oom"
    TIMEOUT = "timeout"
    NODE_LOST = "node_lost"
    GPU_MEMORY_EXCEEDED = "gpu_memory_exceeded"
    EXECUTOR_RESTARTED = "executor_restarted"
    IDLE = "idle"


class RequeueReason(StrEnum):
    RETRY = "retry"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    GPU_UNHEALTHY = "gpu_unhealthy"


@event(Subject.JOB_SUBMITTED)
class JobSubmitted(EventData):
    job_id: str
    name: str
    tenant: str
    user: str
    spec: JobSpec


@event(Subject.JOB_PENDING)
class JobPending(EventData):
    job_id: str
    attempt: int
    reason: PendingReason


@event(Subject.JOB_PLACED)
class JobPlaced(EventData):
    job_id: str
    attempt: int
    placements: list[ReplicaPlacement]
    policy: str = ""
    borrowed: bool = Field(
        False, description="Admitted on other tenants' idle quota: the first to go when they reclaim it."
    )
    serving: bool = Field(
        False,
        description="A serve job's placement: its replicas are model sessions held by the node's serving "
        "service, not processes of its executor (also sent as the `Gpuyard-Holder` header).",
    )

    @property
    def nodes(self) -> list[str]:
        return sorted({p.node for p in self.placements})

    @property
    def holder(self) -> str:
        """Which service of the placed nodes holds the replicas: `serving` or `executor`."""
        return HOLDER_SERVING if self.serving else HOLDER_EXECUTOR


@event(Subject.JOB_STARTED)
class JobStarted(EventData):
    job_id: str
    attempt: int
    node: str
    replicas: list[int]
    notes: list[str] = Field(
        default_factory=list,
        description="What the node could not do for this attempt, in plain words, e.g. "
        "'cpu and memory limits not enforced on this node: …'.",
    )
    isolation: str = Field(
        "",
        description="How the node keeps these replicas from other tenants' jobs, in plain words: 'private "
        "/tmp, /var/tmp and /dev/shm (a mount namespace of its own); /proc lists its user's processes only', "
        "or 'private TMPDIR only: <why>' where /tmp and /proc stay the node's; empty: not said (Kubernetes "
        "pods, an older executor).",
    )


@event(Subject.JOB_REPLICA_EXITED)
class JobReplicaExited(EventData):
    job_id: str
    attempt: int
    node: str
    replica: int
    exit_code: int | None = None
    signal: int | None = None
    reason: FailureReason | None = Field(None, description="None when the replica exited with code 0.")
    message: str = ""
    log_tail: list[str] = Field(default_factory=list)


@event(Subject.JOB_SUCCEEDED)
class JobSucceeded(EventData):
    job_id: str
    attempt: int


@event(Subject.JOB_FAILED)
class JobFailed(EventData):
    job_id: str
    attempt: int
    reason: FailureReason
    message: str
    exit_code: int | None = None
    signal: int | None = None
    replica: int | None = None
    log_tail: list[str] = Field(default_factory=list)


@event(Subject.JOB_CANCEL_REQUESTED)
class JobCancelRequested(EventData):
    job_id: str
    by: str


@event(Subject.JOB_CANCELLED)
class JobCancelled(EventData):
    job_id: str
    attempt: int
    by: str
    message: str = ""


@event(Subject.JOB_PREEMPTED)
class JobPreempted(EventData):
    job_id: str
    attempt: int
    reason: str
    by_job: str | None = None
    grace_seconds: float = 30


@event(Subject.JOB_REQUEUED)
class JobRequeued(EventData):
    job_id: str
    attempt: int = Field(..., description="The NEW attempt number.")
    reason: RequeueReason
    message: str = ""
    not_before: datetime | None = Field(None, description="Retry backoff: do not place before this time.")
    exit_code: int | None = None
