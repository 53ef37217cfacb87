"""The events of a job's life: submitted, pending (with its reason), placed, started, replicas' exits, its end, cancel, preemption, requeue; and the checkpoints it saves."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuyard.shared.contracts.events.envelope import EventData, event, upcaster
from gpuyard.shared.contracts.events.subjects import HOLDER_EXECUTOR, HOLDER_SERVING, Subject
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.contracts.stops import PreemptionCause, preemption_text, read_preemption_text


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
    ENVIRONMENT_FAILED = "environment_failed"


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


@event(Subject.JOB_PREEMPTED, version=2)
class JobPreempted(EventData):
    """A running attempt is stopped within `grace_seconds` (to make room, to empty a drained node), then requeued."""

    job_id: str
    attempt: int
    cause: PreemptionCause = Field(description="Why, for machines: one of the preemption causes.")
    node: str | None = Field(
        None, description="The node the cause names (the drained one), when it names one."
    )
    message: str = Field(
        "",
        description="More words for people where the cause alone does not say it (an `other` cause's text).",
    )
    by_job: str | None = Field(None, description="The job it makes room for, when one.")
    grace_seconds: float = 30
    lost_work_seconds: float | None = Field(
        None,
        ge=0,
        description="The work the attempt loses, in seconds: what it did since its latest checkpoint, or since it "
        "started without one (the scheduler preempts the jobs that lose the least first). None where not "
        "known (a preemption recorded before this figure was sent).",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_reason(cls, data: Any) -> Any:
        """A version 1 preemption kept in a job's stored view (its `preempt_requested`) reads as version 2."""
        if isinstance(data, dict) and "cause" not in data and "reason" in data:
            return _job_preempted_v1(data)
        return data

    @property
    def text(self) -> str:
        """The preemption in words, from its cause: 'drain: node n1 is being drained'."""
        return preemption_text(self.cause, self.node, self.message)


def lost_work_text(seconds: float | None) -> str:
    """A preemption's lost work in words (`JobPreempted.lost_work_seconds`): 'lost about 12 min of work', 'lost
    under a minute of work'; '' where not known."""
    if seconds is None:
        return ""
    if seconds < 60:
        return "lost under a minute of work"
    return f"lost about {int(seconds / 60 + 0.5)} min of work"


@upcaster(Subject.JOB_PREEMPTED, from_version=1)
def _job_preempted_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 said why in free text (`reason`): its known forms become the cause (and the drained node), any
    other text an `other` cause with the text as its message."""
    upgraded = {k: v for k, v in data.items() if k != "reason"}
    cause, node, message = read_preemption_text(str(data.get("reason", "")))
    upgraded.update(cause=cause.value, node=node, message=message)
    return upgraded


@event(Subject.JOB_REQUEUED)
class JobRequeued(EventData):
    job_id: str
    attempt: int = Field(..., description="The NEW attempt number.")
    reason: RequeueReason
    message: str = ""
    not_before: datetime | None = Field(None, description="Retry backoff: do not place before this time.")
    exit_code: int | None = None


@event(Subject.JOB_EXEC_STARTED)
class JobExecStarted(EventData):
    """Someone opened a command or a shell inside a running replica (`gpuyard exec`, `gpuyard shell`, the
    dashboard's terminal; docs/access.md): who, where, what. An audit record: it changes nothing of the job."""

    job_id: str
    attempt: int
    replica: int = Field(ge=0)
    node: str
    by: str = Field(description="Who opened it: the token's or the dashboard session's user.")
    command: list[str] = Field(
        description="What it runs (empty for a shell: the replica user's login shell)."
    )
    tty: bool = Field(description="A terminal (`gpuyard shell`), or a command's output as it comes.")


MAX_CHECKPOINT_NUMBER = 2**63 - 1
"""The largest step and size a checkpoint's report may say (a signed 64-bit integer, as every store keeps one)."""


@event(Subject.JOB_CHECKPOINTED)
class JobCheckpointed(EventData):
    """The job saved a checkpoint (`gpuyard.checkpoint.save`) in its checkpoint folder, which every attempt of it
    shares (docs/storage.md); reported by the job itself through the API, with its checkpoint token. The job's
    view keeps the latest one reported."""

    job_id: str
    attempt: int
    step: int = Field(
        ge=0, le=MAX_CHECKPOINT_NUMBER, description="The step it holds, as the job counts them."
    )
    size_bytes: int = Field(ge=0, le=MAX_CHECKPOINT_NUMBER, description="Its size on disk.")
    saved_at: datetime = Field(description="When the job finished writing it (the job's clock).")
