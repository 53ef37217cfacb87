"""Every event GPUYard publishes: one pydantic model per subject, one registry, one envelope.

Events travel over NATS as CloudEvents 1.0 in *structured* content mode (the NATS protocol binding):
the message payload is the whole event as JSON (`application/cloudevents+json`), and the `Nats-Msg-Id`
header carries the event id so that JetStream de-duplicates a retried publish.

The NATS subject and the CloudEvents `type` come from one definition: type = "io.gpuyard." + subject.
The CloudEvents `subject` attribute names the entity: the job id for job events, the node for node events.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.jobspec import JobSpec

TYPE_PREFIX = "io.gpuyard."
CONTENT_TYPE = "application/cloudevents+json"
_ID_NAMESPACE = uuid.UUID("6c1f7d3e-41a5-4f0e-9a57-6f1d0c1b9a11")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def derived_id(*parts: object) -> str:
    """A deterministic event id: the same fact (job, attempt, kind…) always gets the same id.

    This is what makes a repeated effect harmless: the store refuses a second event with the same id,
    and JetStream drops a second publish with the same Nats-Msg-Id.
    """
    # uuid.uuid5(_ID_NAMESPACE, name).hex, computed directly at a third of its cost: SHA-1 of the namespace
    # and the name, version 5 and the RFC 4122 variant set in its first 16 bytes
    digest = bytearray(hashlib.sha1(_ID_NAMESPACE_BYTES + "/".join(map(str, parts)).encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return digest.hex()


class Subject(StrEnum):
    JOB_SUBMITTED = "job.submitted"
    JOB_PENDING = "job.pending"
    JOB_PLACED = "job.placed"
    JOB_STARTED = "job.started"
    JOB_REPLICA_EXITED = "job.replica_exited"
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_CANCEL_REQUESTED = "job.cancel_requested"
    JOB_CANCELLED = "job.cancelled"
    JOB_PREEMPTED = "job.preempted"
    JOB_REQUEUED = "job.requeued"
    NODE_HEARTBEAT = "node.heartbeat"
    NODE_LOST = "node.lost"
    GPU_SAMPLE = "gpu.sample"
    SERVICE_HEARTBEAT = "service.heartbeat"
    MODEL_PUBLISHED = "model.published"
    ALERT_RAISED = "alert.raised"
    ALERT_RESOLVED = "alert.resolved"


class StreamDef(BaseModel):
    """A JetStream stream: its shape sits beside the subjects it carries; services declare it at start-up."""

    name: str
    subjects: list[str]
    max_age_seconds: float
    duplicate_window_seconds: float = 600
    description: str


EVENTS_STREAM = StreamDef(
    name="GPUYARD_EVENTS",
    subjects=["job.>", "model.>", "alert.>", "node.lost"],
    max_age_seconds=30 * 86400,
    description="State changes: jobs, models, alerts, lost nodes. Kept 30 days.",
)
TELEMETRY_STREAM = StreamDef(
    name="GPUYARD_TELEMETRY",
    subjects=["gpu.>", "node.heartbeat", "service.>"],
    max_age_seconds=3600,
    duplicate_window_seconds=60,
    description="High-rate samples and heartbeats. Kept 1 hour.",
)
DEADLETTER_STREAM = StreamDef(
    name="GPUYARD_DEADLETTER",
    subjects=["deadletter.>"],
    max_age_seconds=14 * 86400,
    description="Events a consumer gave up on after its maximum deliveries, with the error. Kept 14 days.",
)
STREAMS = (EVENTS_STREAM, TELEMETRY_STREAM, DEADLETTER_STREAM)


class EventData(BaseModel):
    """Base of every event payload. Readers tolerate fields they do not know (forward compatible)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    subject: ClassVar[Subject]

    def entity(self) -> str | None:
        """The CloudEvents `subject` attribute: which job/node/model this event is about."""
        return getattr(self, "job_id", None) or getattr(self, "node", None) or getattr(self, "name", None)


REGISTRY: dict[Subject, type[EventData]] = {}


def event(subject: Subject):
    def register(cls: type[EventData]) -> type[EventData]:
        if subject in REGISTRY:
            raise RuntimeError(f"two event models for {subject}")
        cls.subject = subject
        REGISTRY[subject] = cls
        return cls

    return register


# ---------------------------------------------------------------- jobs


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
    code: str = Field(
        ..., description="E.g. insufficient_gpus, quota_exceeded, no_matching_gpu_model, gang_not_fit."
    )
    message: str
    details: dict[str, Any] = Field(default_factory=dict)
    position: int | None = Field(None, description="1-based place in the queue among waiting jobs.")
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


class RequeueReason(StrEnum):
    RETRY = "retry"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"


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

    @property
    def nodes(self) -> list[str]:
        return sorted({p.node for p in self.placements})


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


# ---------------------------------------------------------------- nodes, GPUs, services


class GpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    index: int
    uuid: str
    model: str
    memory_bytes: int


@event(Subject.NODE_HEARTBEAT)
class NodeHeartbeat(EventData):
    node: str
    gpus: list[GpuInfo]
    cpus: float
    memory_bytes: int
    simulated: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    interval_seconds: float = 5.0


@event(Subject.NODE_LOST)
class NodeLost(EventData):
    node: str
    last_seen: datetime
    message: str = ""


@event(Subject.GPU_SAMPLE)
class GpuSample(EventData):
    node: str
    index: int
    uuid: str
    model: str = ""
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float | None = None
    power_w: float | None = None
    simulated: bool = False


@event(Subject.SERVICE_HEARTBEAT)
class ServiceHeartbeat(EventData):
    service: str
    instance: str
    pid: int
    host: str
    started_at: datetime
    version: str

    def entity(self) -> str | None:
        return self.instance


# ---------------------------------------------------------------- models and alerts


@event(Subject.MODEL_PUBLISHED)
class ModelPublished(EventData):
    name: str
    version: str
    uri: str = Field(..., description="Where the ONNX file is: a local path or an s3:// URI.")
    job_id: str | None = None
    format: Literal["onnx"] = "onnx"


@event(Subject.ALERT_RAISED)
class AlertRaised(EventData):
    alert_id: str
    kind: str = Field(..., description="gpu_idle, gpu_overheating, node_lost, job_stuck…")
    severity: Literal["info", "warning", "critical"] = "warning"
    message: str
    node: str | None = None
    gpu_index: int | None = None
    job_id: str | None = None


@event(Subject.ALERT_RESOLVED)
class AlertResolved(EventData):
    alert_id: str
    kind: str
    message: str = ""


# ---------------------------------------------------------------- the envelope


class CloudEvent(BaseModel):
    """A CloudEvents 1.0 event, structured mode. `data` is the typed payload for `type`."""

    model_config = ConfigDict(frozen=True)

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=new_id)
    source: str
    type: str
    subject: str | None = None
    time: datetime = Field(default_factory=utcnow)
    datacontenttype: Literal["application/json"] = "application/json"
    data: EventData

    @model_validator(mode="before")
    @classmethod
    def _typed_data(cls, values: Any) -> Any:
        if isinstance(values, dict) and isinstance(values.get("data"), dict):
            model = REGISTRY.get(subject_of_type(values.get("type", "")))
            if model is None:
                raise ValueError(f"unknown event type {values.get('type')!r}")
            values = {**values, "data": model.model_validate(values["data"])}
        return values

    @property
    def nats_subject(self) -> Subject:
        return subject_of_type(self.type)

    def to_json(self) -> bytes:
        return self.model_dump_json(serialize_as_any=True).encode()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", serialize_as_any=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> CloudEvent:
        return cls.model_validate_json(raw)


def type_of(subject: Subject) -> str:
    return TYPE_PREFIX + subject.value


_SUBJECT_OF_TYPE = {type_of(s): s for s in Subject}  # (Subject(value) costs microseconds on every event)


def subject_of_type(ce_type: str) -> Subject:
    subject = _SUBJECT_OF_TYPE.get(ce_type)
    if subject is not None:
        return subject
    if not ce_type.startswith(TYPE_PREFIX):
        raise ValueError(f"not a GPUYARD event type: {ce_type!r}")
    raise ValueError(f"unknown event type {ce_type!r}")


def make_event(
    data: EventData, *, source: str, id: str | None = None, time: datetime | None = None
) -> CloudEvent:
    return CloudEvent(
        id=id or new_id(),
        source=source,
        type=type_of(data.subject),
        subject=data.entity(),
        time=time or utcnow(),
        data=data,
    )
