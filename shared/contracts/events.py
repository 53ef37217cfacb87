"""Every event GPUYard publishes: one pydantic model per subject, one registry, one envelope.

Events travel over NATS as CloudEvents 1.0 in *structured* content mode (the NATS protocol binding):
the message payload is the whole event as JSON (`application/cloudevents+json`), and the `Nats-Msg-Id`
header carries the event id so that JetStream de-duplicates a retried publish.

The NATS subject and the CloudEvents `type` come from one definition: type = "io.gpuyard." + subject.
The CloudEvents `subject` attribute names the entity: the job id for job events, the node for node events.
A job event travels on its subject followed by its job's tenant, `job.placed.vision` (`subject_of`), so that
NATS permissions can give a reader one tenant's events (`job.*.vision`); its `type` does not carry the tenant.

Versions: every event model has a version (`@event(subject, version=N)`, 1 by default), carried in the
envelope's `dataversion` extension attribute (an event without it is version 1). When a model changes, its
version goes up by one and an upcaster for the step (`@upcaster(subject, from_version=N-1)`, a function on
the raw `data` dict, written next to the model) upgrades what was stored or sent before; every event parsed
into a `CloudEvent` (from the store, the bus, an API) is upgraded on the way in, and one newer than the
reader's model is refused (`EventVersionError`) rather than misread.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuyard.shared.contracts.jobspec import NAME_PATTERN, JobSpec
from gpuyard.shared.contracts.reasons import PendingCode

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
    NODE_GPU_HEALTH = "node.gpu_health"
    NODE_CONTROL = "node.control"
    GPU_SAMPLE = "gpu.sample"
    SERVICE_HEARTBEAT = "service.heartbeat"
    SERVICE_STATUS = "service.status"
    MODEL_PUBLISHED = "model.published"
    MODEL_VISIBILITY_CHANGED = "model.visibility_changed"
    MODEL_DELETED = "model.deleted"
    MODEL_READY = "model.ready"
    MODEL_FAILED = "model.failed"
    ALERT_RAISED = "alert.raised"
    ALERT_RESOLVED = "alert.resolved"
    IDLE_WARNING = "idle.warning"
    IDLE_STOP = "idle.stop"


class Wildcard(StrEnum):
    """NATS subject wildcards: every event of one family (a stream's subjects, a watcher's filter)."""

    JOB = "job.>"
    MODEL = "model.>"
    ALERT = "alert.>"
    GPU = "gpu.>"
    SERVICE = "service.>"
    DEADLETTER = "deadletter.>"
    IDLE = "idle.>"


JOB_SUBJECTS = frozenset(s for s in Subject if s.value.startswith("job."))
ATTEMPT_STOPS = (
    Subject.JOB_PREEMPTED,
    Subject.JOB_SUCCEEDED,
    Subject.JOB_FAILED,
    Subject.JOB_CANCELLED,
    Subject.JOB_REQUEUED,
)
"""The job events that stop or end an attempt: they concern only the host that holds it (`gpuyard.shared.bus.jetstream.
concerns_holder`)."""
CONTROL_SUBJECTS = (Subject.JOB_CANCEL_REQUESTED, *ATTEMPT_STOPS)
HOLDER_EXECUTOR = "executor"
HOLDER_SERVING = "serving"
"""Who holds a placement's replicas (`JobPlaced.holder`): a node's executor runs processes, its serving service
holds model sessions."""
"""What a host of replicas (an executor, a serving service) follows besides its placements."""
"""The subjects whose events are published with their job's tenant as a last token (`subject_of`)."""
TENANT_RULE = (
    "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 chars"
)
_TENANT = re.compile(NAME_PATTERN)
_TENANTS_SEEN: set[str] = set()  # tenants already checked (one set lookup per event, not a regex)


def tenant_error(tenant: object) -> str | None:
    """Why `tenant` cannot name a tenant (it must be usable as one NATS subject token: no '.', '*', '>' or
    space), or None when it can."""
    if tenant in _TENANTS_SEEN:
        return None
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        return f"tenant {tenant!r} is not a valid tenant name: use {TENANT_RULE}"
    if len(_TENANTS_SEEN) < 100_000:
        _TENANTS_SEEN.add(tenant)
    return None


def subject_filter(subject: Subject, tenant: str | None = None) -> str:
    """The NATS subject filter of `subject`'s events: of one `tenant`'s jobs, or of every tenant's (None).
    Subjects other than job subjects carry no tenant: their filter is the subject itself."""
    if subject not in JOB_SUBJECTS:
        if tenant is not None:
            raise ValueError(f"{subject} events carry no tenant")
        return subject.value
    return f"{subject.value}.{_checked(tenant)}" if tenant is not None else f"{subject.value}.*"


def job_subject(nats_subject: str) -> Subject | None:
    """What kind of job event came on `nats_subject` (`job.placed.vision`: JOB_PLACED), told without decoding
    the event; None for a subject that is not a job event's."""
    try:
        subject = Subject(nats_subject.rpartition(".")[0])
    except ValueError:
        return None
    return subject if subject in JOB_SUBJECTS else None


def tenant_wildcard(tenant: str) -> str:
    """Every job event of one tenant: `job.*.<tenant>` (what a tenant's integrator may subscribe to)."""
    return f"job.*.{_checked(tenant)}"


def tenant_of_subject(nats_subject: str) -> str | None:
    """The tenant a NATS subject names: the last token of a job event's subject, None for other subjects."""
    family, _, rest = nats_subject.partition(".")
    if family != "job" or rest.count(".") != 1:
        return None
    return rest.rpartition(".")[2]


def _checked(tenant: str) -> str:
    error = tenant_error(tenant)
    if error is not None:
        raise ValueError(error)
    return tenant


class StreamDef(BaseModel):
    """A JetStream stream: its shape sits beside the subjects it carries; services declare it at start-up.

    Limits (age, bytes, messages) drop the oldest messages first (discard old): a publish is never refused
    for want of space, so the outbox never backs up behind a full stream. The event store is the truth and
    the bus the transport: what a lagging consumer loses past a limit, its service reads from the store."""

    name: str
    subjects: list[str]
    max_age_seconds: float
    max_bytes: int = -1  # -1: no limit (the settings give one: `limited`)
    max_msgs: int = -1
    duplicate_window_seconds: float = 600
    description: str

    def limited(self, max_bytes: int, max_msgs: int) -> StreamDef:
        return self.model_copy(update={"max_bytes": max_bytes or -1, "max_msgs": max_msgs or -1})


EVENTS_STREAM = StreamDef(
    name="GPUYARD_EVENTS",
    subjects=[
        Wildcard.JOB,
        Wildcard.MODEL,
        Wildcard.ALERT,
        Subject.NODE_LOST,
        Subject.NODE_GPU_HEALTH,
        Subject.NODE_CONTROL,
        Wildcard.IDLE,
    ],
    max_age_seconds=30 * 86400,
    description="State changes: jobs, models, alerts, lost nodes, GPU health, cordons. Kept 30 days.",
)
TELEMETRY_STREAM = StreamDef(
    name="GPUYARD_TELEMETRY",
    subjects=[Wildcard.GPU, Subject.NODE_HEARTBEAT, Wildcard.SERVICE],
    max_age_seconds=3600,
    duplicate_window_seconds=60,
    description="High-rate samples and heartbeats. Kept 1 hour.",
)
DEADLETTER_STREAM = StreamDef(
    name="GPUYARD_DEADLETTER",
    subjects=[Wildcard.DEADLETTER],
    max_age_seconds=14 * 86400,
    description="Events a consumer gave up on after its maximum deliveries, with the error. Kept 14 days.",
)
STREAMS = (EVENTS_STREAM, TELEMETRY_STREAM, DEADLETTER_STREAM)


class EventData(BaseModel):
    """Base of every event payload. Readers tolerate fields they do not know (forward compatible)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    subject: ClassVar[Subject]
    schema_version: ClassVar[int] = 1  # see `event` and `upcaster`

    def entity(self) -> str | None:
        """The CloudEvents `subject` attribute: which job/node/model this event is about."""
        return getattr(self, "job_id", None) or getattr(self, "node", None) or getattr(self, "name", None)


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
REGISTRY: dict[Subject, type[EventData]] = {}
UPCASTERS: dict[tuple[Subject, int], Upcaster] = {}  # (subject, version) -> its data as version + 1 has it


def event(subject: Subject, *, version: int = 1):
    """Register the model of `subject`'s data, at `version` (bumped by one with every change of the model,
    with an `upcaster` for the step)."""

    def register(cls: type[EventData]) -> type[EventData]:
        if subject in REGISTRY:
            raise RuntimeError(f"two event models for {subject}")
        if version < 1:
            raise RuntimeError(f"{subject}: versions start at 1, not {version}")
        cls.subject = subject
        cls.schema_version = version
        REGISTRY[subject] = cls
        return cls

    return register


def upcaster(subject: Subject, *, from_version: int):
    """Register `fn(data) -> data`: the `data` dict of a `subject` event of `from_version`, upgraded to
    `from_version + 1` (a new dict; renamed fields renamed, added ones given their value for old events)."""

    def register(fn: Upcaster) -> Upcaster:
        if (subject, from_version) in UPCASTERS:
            raise RuntimeError(f"two upcasters for {subject} from version {from_version}")
        UPCASTERS[subject, from_version] = fn
        return fn

    return register


class EventVersionError(ValueError):
    """An event whose data version this reader cannot read: newer than its model, or with no upcaster."""


def upcast(subject: Subject, data: dict[str, Any], version: int) -> dict[str, Any]:
    """`data` of a `subject` event of `version`, as the registered model (its current version) reads it."""
    current = REGISTRY[subject].schema_version
    if version == current:
        return data
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise EventVersionError(
            f"{subject} event: dataversion must be a whole number from 1, not {version!r}"
        )
    if version > current:
        raise EventVersionError(
            f"{subject} event of data version {version} is newer than this reader's model (version {current}):"
            " upgrade GPUYard to read it"
        )
    for step in range(version, current):
        up = UPCASTERS.get((subject, step))
        if up is None:
            raise EventVersionError(f"{subject} event: no upcaster from data version {step} to {step + 1}")
        data = up(dict(data))
    return data


def missing_upcasters() -> list[tuple[Subject, int]]:
    """(subject, from_version) of every step no upcaster covers: empty when every model reads all its versions."""
    return [
        (subject, v)
        for subject, model in REGISTRY.items()
        for v in range(1, model.schema_version)
        if (subject, v) not in UPCASTERS
    ]


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


SERVICE_HEARTBEAT_SECONDS = 5.0
"""How often a service process sends its `service.heartbeat`."""


@event(Subject.SERVICE_HEARTBEAT, version=2)
class ServiceHeartbeat(EventData):
    service: str
    instance: str
    pid: int
    host: str
    started_at: datetime
    version: str
    metrics: str | None = Field(
        None,
        description="The URL of the process's Prometheus /metrics, e.g. http://10.0.0.7:9410/metrics; None "
        "where it serves none.",
    )

    def entity(self) -> str | None:
        return self.instance


@upcaster(Subject.SERVICE_HEARTBEAT, from_version=1)
def _service_heartbeat_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 did not say where the process's /metrics is."""
    return {**data, "metrics": None}


class ProcessState(StrEnum):
    """What a supervisor says of a service process it runs (`service.status`)."""

    RUNNING = "running"
    """Started, and not exited since; or run a minute without exiting since its last restart (stable again)."""
    RESTARTING = "restarting"
    """It exited and is being started again (its supervisor waits 1 s, then 2, 4… up to 30 s)."""
    CRASH_LOOPING = "crash_looping"
    """It exited again and again, each time within a minute of starting; it is still started again, later each
    time."""
    REFUSED = "refused"
    """It refused its configuration: starting it again would not help (`gpuyard up` stops)."""


LAST_ERROR_CHARS = 500
"""The most of a process's last words a `service.status` event carries (longer ones are cut, ending in '…')."""


@event(Subject.SERVICE_STATUS)
class ServiceStatus(EventData):
    """What a supervisor (`gpuyard up`) says of a service process it runs, which cannot say it itself once it
    keeps crashing. Sent when the process exits, is started again or runs stable again, and every
    `interval_seconds` for each process (a reader that missed one, or started since, knows it within seconds;
    one not repeated for three intervals is stale: its supervisor is gone). A service calls its instance
    `<host>-<pid>`, so the `service.heartbeat` events of this process are those of this host and pid."""

    service: str = Field(..., description="submit, scheduler, executor, monitor or serving.")
    process: str = Field(
        ..., description="The supervisor's name of the process: the service's, or executor-1, executor-2…"
    )
    host: str
    pid: int = Field(..., description="The process now: the one running, or the one that just exited.")
    state: ProcessState
    restarts: int = Field(0, ge=0, description="How many times the supervisor has started it again.")
    exit_code: int | None = Field(
        None,
        description="How its last exit ended, when it is not running: its exit status, or minus the signal "
        "that killed it.",
    )
    last_error: str | None = Field(
        None,
        max_length=LAST_ERROR_CHARS,
        description="The last line it wrote before that exit (a crash's or a refusal's reason), when it is not "
        "running.",
    )
    version: str = Field(..., description="The GPUYARD version the supervisor runs it from.")
    interval_seconds: float = Field(SERVICE_HEARTBEAT_SECONDS, gt=0)

    def entity(self) -> str | None:
        return f"{self.host}/{self.process}"


# ---------------------------------------------------------------- models and alerts


V2_DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
)
"""Tensor datatypes as the Open Inference Protocol (v2) names them."""
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class TensorSpec(BaseModel):
    """One input or output of a model, as its ONNX graph declares it."""

    model_config = ConfigDict(frozen=True)
    name: str
    datatype: str = Field(..., description="Open Inference Protocol datatype: FP32, INT64, BOOL, BYTES…")
    shape: list[int] = Field(..., description="Dimensions; -1 for a dynamic one (a batch, a sequence).")


class _ModelEvent(EventData):
    name: str = Field(..., pattern=NAME_PATTERN)
    tenant: str = Field(..., pattern=NAME_PATTERN, description="The tenant that owns the model.")

    def entity(self) -> str | None:
        return f"{self.tenant}/{self.name}"  # a model's name is its tenant's: two tenants may use the same


@event(Subject.MODEL_PUBLISHED)
class ModelPublished(_ModelEvent):
    """A version of a model is in the model store, immutable: its bytes are `sha256` for good (the same
    version with other bytes is refused), and every load checks them. (Version 1 of this event's data: the
    earlier placeholder was never published.)"""

    version: int = Field(..., ge=1, description="1, 2, 3… per tenant and name, assigned unless given.")
    uri: str = Field(..., description="Where the ONNX file is: a local path or an fsspec URL (s3://…).")
    sha256: str = Field(..., pattern=SHA256_PATTERN, description="SHA-256 of the file, hex.")
    size_bytes: int = Field(..., ge=0)
    inputs: list[TensorSpec] = Field(default_factory=list, description="The graph's inputs.")
    outputs: list[TensorSpec] = Field(default_factory=list, description="The graph's outputs.")
    job_id: str | None = Field(None, description="The job that published it, from inside (its token).")
    user: str = Field("", description="Who published it (the token's user; empty for a job).")
    public: bool = Field(False, description="Whether every tenant may see and use the model.")
    format: Literal["onnx"] = "onnx"


@event(Subject.MODEL_VISIBILITY_CHANGED)
class ModelVisibilityChanged(_ModelEvent):
    """A model was made public (every tenant may see and use it) or private again (its tenant's only)."""

    public: bool
    by: str = ""


@event(Subject.MODEL_DELETED)
class ModelDeleted(_ModelEvent):
    """Versions of a model were removed from its listing and their files from the model store. A version's
    number is never given again."""

    versions: list[int] = Field(..., description="The versions removed.")
    whole_model: bool = Field(False, description="Every version was asked for (`DELETE /v1/models/{name}`).")
    by: str = ""


class ExecutionProvider(StrEnum):
    """The ONNX Runtime execution provider a replica's session runs on."""

    CUDA = "CUDAExecutionProvider"
    CPU = "CPUExecutionProvider"


@event(Subject.MODEL_READY)
class ModelReady(_ModelEvent):
    """A replica of a deployment (its serve job) holds the model's session and answers requests: the serving
    service of `node` routes to it, and the others send it their requests for this model through one hop to
    `endpoint`. The newest ready version of a model is its default."""

    version: int = Field(..., ge=1, description="The version the replica serves.")
    job_id: str = Field(..., description="The serve job (one replica of the deployment).")
    node: str = Field(..., description="The node whose serving service holds the session.")
    endpoint: str = Field(..., description="That serving service's URL, e.g. http://10.0.0.7:8000.")
    provider: ExecutionProvider = Field(..., description="Where the session runs: CUDA, or the CPU.")
    device: int | None = Field(None, description="The GPU index on the node (CUDA), None on the CPU.")


@event(Subject.MODEL_FAILED)
class ModelFailed(_ModelEvent):
    """A replica could not load (or lost) the model: a checksum mismatch, an ONNX graph ONNX Runtime refuses,
    a provider that cannot start. The versions already ready keep serving."""

    version: int = Field(..., ge=1)
    job_id: str = Field(..., description="The serve job whose replica failed.")
    node: str
    reason: str = Field(..., description="Why, for machines: checksum_mismatch, invalid_model, load_failed…")
    message: str = Field(..., description="Why, for people.")


class AlertSeverity(StrEnum):
    """How urgent an alert is; each rule has its default, which the rules file may change."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class AlertKind(StrEnum):
    """What raised an alert: one of the monitor's rules (the rules file names each by its kind), the monitor's
    idle-GPU reclaim (`job_idle`) or the executor's GPU slice guard (`gpu_memory_over_slice`)."""

    GPU_IDLE = "gpu_idle"
    GPU_TEMPERATURE = "gpu_temperature"
    GPU_POWER = "gpu_power"
    GPU_XID = "gpu_xid"
    JOB_XID = "job_xid"
    GPU_ECC = "gpu_ecc"
    GPU_LOST = "gpu_lost"
    NODE_LOST = "node_lost"
    JOB_WAITING = "job_waiting"
    JOB_SILENT = "job_silent"
    JOB_IDLE = "job_idle"
    GPU_MEMORY_OVER_SLICE = "gpu_memory_over_slice"


@event(Subject.ALERT_RAISED)
class AlertRaised(EventData):
    """A condition that needs someone's attention began (after its rule's `for` time). `alert_id` names the
    rule and its subject (e.g. `gpu_idle/node-1/2`): one alert is active per id at a time, until its
    `alert.resolved`."""

    alert_id: str
    kind: AlertKind = Field(..., description="The rule or the check that raised it.")
    severity: AlertSeverity = AlertSeverity.WARNING
    message: str = Field(..., description="What happened, in plain words.")
    node: str | None = None
    gpu_index: int | None = None
    job_id: str | None = None
    tenant: str | None = Field(None, description="The tenant of the job it is about: who may see it.")
    user: str | None = None
    value: float | None = Field(None, description="The figure that raised it (°C, W, %, minutes…).")
    threshold: float | None = Field(None, description="The rule's threshold that figure crossed.")

    def entity(self) -> str | None:
        return self.alert_id


@event(Subject.ALERT_RESOLVED)
class AlertResolved(EventData):
    alert_id: str
    kind: AlertKind
    message: str = ""
    tenant: str | None = Field(None, description="As in its `alert.raised`.")

    def entity(self) -> str | None:
        return self.alert_id


# ---------------------------------------------------------------- idle-GPU reclaim


class _IdleEvent(EventData):
    job_id: str
    attempt: int = Field(..., ge=1, description="The attempt that leaves its GPUs idle.")
    tenant: str = Field(..., description="The job's tenant.")
    user: str = ""
    threshold_pct: float = Field(..., description="The idle threshold: GPU utilization under it is idle.")
    window_seconds: float = Field(..., description="The job's idle timeout: the window every sample was in.")
    max_utilization_pct: float = Field(
        ..., description="The highest utilization of any of the job's GPUs in that window."
    )
    message: str = Field(..., description="The same, in plain words.")


@event(Subject.IDLE_WARNING)
class IdleWarning(_IdleEvent):
    """A running job's GPUs stayed under the idle threshold in every sample for its idle timeout (after its
    start-up allowance): it is stopped after `grace_seconds` unless they get busy. Recorded and published by
    the monitor that evaluates the alert rules, which also raises a `job_idle` alert; the executor writes a
    line into the job's output (docs/monitor.md, Idle-GPU reclaim)."""

    grace_seconds: float = Field(
        ..., description="How long the job has to use its GPUs before it is stopped."
    )
    stop_at: datetime = Field(..., description="When it is stopped unless its GPUs get busy.")


@event(Subject.IDLE_STOP)
class IdleStop(_IdleEvent):
    """A warned job's GPUs stayed idle through its grace: the executor stops it as it stops a preempted job
    (SIGTERM, `GPUYARD_GRACE_SECONDS` to checkpoint, SIGKILL) and it ends `failed` with the reason `idle`
    and this message, never retried; its GPUs go back to the queue."""

    idle_seconds: float = Field(..., description="How long its GPUs had been idle when it was stopped.")


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
    dataversion: int = Field(1, description="Version of the data's model (an extension attribute).")
    data: EventData

    @model_validator(mode="before")
    @classmethod
    def _typed_data(cls, values: Any) -> Any:
        """Raw data becomes its model (upgraded from an older version first); the envelope always names the
        version of the data it holds."""
        if not isinstance(values, dict):
            return values
        data = values.get("data")
        if isinstance(data, dict):
            subject = subject_of_type(values.get("type", ""))
            model = REGISTRY.get(subject)
            if model is None:
                raise ValueError(f"no event model for {subject}")
            version = values.get("dataversion", 1)
            if version != model.schema_version:
                data = upcast(subject, data, version)
            return {**values, "data": model.model_validate(data), "dataversion": model.schema_version}
        if isinstance(data, EventData) and values.get("dataversion") != data.schema_version:
            return {**values, "dataversion": data.schema_version}
        return values

    @property
    def nats_subject(self) -> Subject:
        """What kind of event it is (its `type` as a Subject); the subject it is published on is
        `subject_of(event, tenant)`."""
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


def subject_of(event: CloudEvent, tenant: str | None = None) -> str:
    """The NATS subject `event` is published on: a job event's subject followed by its job's `tenant`
    (`job.placed.vision`; a `job.submitted` event names its tenant itself), any other event's subject as it is.
    ValueError for a job event without a valid tenant."""
    subject = event.nats_subject
    if subject not in JOB_SUBJECTS:
        return subject.value
    if tenant is None:
        tenant = getattr(event.data, "tenant", None)
        if tenant is None:
            raise ValueError(f"{subject} event {event.id}: its job's tenant is needed to publish it")
    return f"{subject.value}.{_checked(tenant)}"
