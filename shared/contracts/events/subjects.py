"""The bus's subjects, one definition: each event's subject (`Subject`), the wildcards, the tenant suffix of job subjects, and the JetStream streams that keep them."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel

from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN


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
    JOB_CHECKPOINTED = "job.checkpointed"
    JOB_EXEC_STARTED = "job.exec_started"
    NODE_HEARTBEAT = "node.heartbeat"
    NODE_LOST = "node.lost"
    NODE_GPU_HEALTH = "node.gpu_health"
    NODE_CONTROL = "node.control"
    NODE_ENVIRONMENT_REMOVE = "node.environment_remove"
    GPU_SAMPLE = "gpu.sample"
    SERVICE_HEARTBEAT = "service.heartbeat"
    SERVICE_STATUS = "service.status"
    MODEL_PUBLISHED = "model.published"
    MODEL_VISIBILITY_CHANGED = "model.visibility_changed"
    MODEL_DELETED = "model.deleted"
    MODEL_READY = "model.ready"
    MODEL_FAILED = "model.failed"
    VOLUME_CREATED = "volume.created"
    VOLUME_FILES_WRITTEN = "volume.files_written"
    VOLUME_FILES_DELETED = "volume.files_deleted"
    VOLUME_DELETED = "volume.deleted"
    ALERT_RAISED = "alert.raised"
    ALERT_RESOLVED = "alert.resolved"
    IDLE_WARNING = "idle.warning"
    IDLE_STOP = "idle.stop"
    DEV_ACTIVITY = "dev.activity"


class Wildcard(StrEnum):
    """NATS subject wildcards: every event of one family (a stream's subjects, a watcher's filter)."""

    JOB = "job.>"
    MODEL = "model.>"
    VOLUME = "volume.>"
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
"""The job events that stop or end an attempt: they concern only the host that holds it
(`gpuyard.shared.bus.headers.concerns_holder`)."""


HOLDER_EXECUTOR = "executor"


HOLDER_SERVING = "serving"
"""Who holds a placement's replicas (`JobPlaced.holder`): a node's executor runs processes, its serving service
holds model sessions."""

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
        Wildcard.VOLUME,
        Wildcard.ALERT,
        Subject.NODE_LOST,
        Subject.NODE_GPU_HEALTH,
        Subject.NODE_CONTROL,
        Subject.NODE_ENVIRONMENT_REMOVE,
        Wildcard.IDLE,
    ],
    max_age_seconds=30 * 86400,
    description="State changes: jobs, models, volumes, alerts, lost nodes, GPU health, cordons. Kept 30 days.",
)


TELEMETRY_STREAM = StreamDef(
    name="GPUYARD_TELEMETRY",
    subjects=[Wildcard.GPU, Subject.NODE_HEARTBEAT, Wildcard.SERVICE, Subject.DEV_ACTIVITY],
    max_age_seconds=3600,
    duplicate_window_seconds=60,
    description="High-rate samples, heartbeats and dev environments' activity. Kept 1 hour.",
)


DEADLETTER_STREAM = StreamDef(
    name="GPUYARD_DEADLETTER",
    subjects=[Wildcard.DEADLETTER],
    max_age_seconds=14 * 86400,
    description="Events a consumer gave up on after its maximum deliveries, with the error. Kept 14 days.",
)


STREAMS = (EVENTS_STREAM, TELEMETRY_STREAM, DEADLETTER_STREAM)
