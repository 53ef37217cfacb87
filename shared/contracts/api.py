"""The public API model: what the submit API answers, one model per answer, for the service, the CLI and the
dashboard alike.

The internal views (`gpuyard.shared.contracts.jobstate.JobView`) carry what the platform needs to run jobs (the store's version
counter, each replica's raw exit, a pending preemption as the event that asked for it, the log tail); users
rely only on what is here. `job_out` maps a view to its public form; `pending_text` is the one rendering of
a pending reason.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from gpuyard.shared.contracts.events.alerts import AlertSeverity
from gpuyard.shared.contracts.events.jobs import FailureReason, PendingReason
from gpuyard.shared.contracts.events.models import TensorSpec
from gpuyard.shared.contracts.events.services import ProcessState
from gpuyard.shared.contracts.jobspec import (
    DEFAULT_PRIORITY,
    JSON_INTEGER,
    MAX_DEPLOYMENT_REPLICAS,
    MAX_MODEL_VERSION,
    PRIORITY_CLASSES,
    Integer,
    JobSpec,
    Name,
    Priority,
    Resources,
    Seconds,
    Strict,
    Text,
)
from gpuyard.shared.contracts.jobstate import JobState, JobView
from gpuyard.shared.contracts.reasons import PendingCode, waiting_message


class Out(BaseModel):
    """Base of every answer. Readers ignore fields they do not know, so a newer server does not break an
    older CLI."""

    model_config = ConfigDict(extra="ignore", frozen=True)


PublicModel = TypeVar("PublicModel", bound=Out)

# ---------------------------------------------------------------- jobs


class PendingOut(Out):
    """Why a queued job waits."""

    code: PendingCode = Field(description="The reason, from a closed set of codes.")
    message: str = Field(description="The reason for people, with its numbers.")
    details: dict[str, Any] = Field(default_factory=dict, description="The numbers behind the message.")
    position: int | None = Field(None, description="1-based place in the queue among waiting jobs.")
    estimated_start: datetime | None = None


class GpuShareOut(Out):
    index: int = Field(description="GPU index on the node.")
    fraction: float = Field(1.0, description="1.0 for a whole GPU, less for a shared one.")
    memory_bytes: int | None = Field(None, description="Memory slice of a shared GPU.")


class PlacementOut(Out):
    """Where one replica of the current attempt runs."""

    replica: int
    node: str
    gpus: list[GpuShareOut] = Field(default_factory=list)
    cpus: float = 0
    memory_bytes: int = 0


class PreemptionOut(Out):
    """A running job being stopped to make room; it is queued again as a new attempt."""

    reason: str
    by_job: str | None = Field(None, description="The job it makes room for, if one.")
    grace_seconds: float


class FailureOut(Out):
    """How a failed job ended."""

    reason: FailureReason
    message: str
    exit_code: int | None = None
    signal: int | None = None
    replica: int | None = Field(None, description="The replica whose end failed the job, when one did.")


class AttemptOut(Out):
    """One try at running the job: when, where and how it ended."""

    number: int
    queued_at: datetime
    placed_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    nodes: list[str] = Field(default_factory=list)
    outcome: str | None = Field(None, description="None while in progress; e.g. 'succeeded', 'failed: …'.")
    exit_code: int | None = None
    message: str = ""
    notes: list[str] = Field(default_factory=list, description="What the nodes could not do for it.")


class JobOut(Out):
    job_id: str
    name: str
    tenant: str
    user: str
    spec: JobSpec
    state: JobState
    attempt: int = Field(description="The current attempt, from 1.")
    gpus: float = Field(description="GPUs over all replicas.")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    pending: PendingOut | None = Field(None, description="Why it waits, while queued.")
    not_before: datetime | None = Field(None, description="Retry backoff: not placed before this time.")
    placements: list[PlacementOut] = Field(default_factory=list)
    borrowed: bool = Field(False, description="Runs on another tenant's idle quota: the first to go.")
    cancel_requested: bool = False
    preemption: PreemptionOut | None = Field(None, description="Being preempted, while placed or running.")
    failure: FailureOut | None = Field(None, description="How it failed, once failed.")
    message: str = Field("", description="The latest word on it: why it failed, was cancelled or requeued.")
    attempts: list[AttemptOut] = Field(default_factory=list)


CURSOR_PATTERN = r"^([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2,3})?$"
"""A page cursor (`?cursor=`): base64url, unpadded. Every such text is a place in a listing, where its next page
starts: the cursor a page answers, or any other (a cursor not made by a page is a place all the same)."""
CURSOR_MAX = 1000


def page_cursor(created_at: str, item_id: str) -> str:
    """The cursor of the place after the item created at `created_at` with id `item_id` (in either order)."""
    return base64.urlsafe_b64encode(f"{created_at}\n{item_id}".encode()).decode().rstrip("=")


def page_place(cursor: str) -> tuple[str, str]:
    """(created_at, item id) of a cursor matching CURSOR_PATTERN (bytes that are not UTF-8 read as U+FFFD)."""
    text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8", "replace")
    created_at, _, item_id = text.replace("\x00", "\ufffd").partition("\n")
    return created_at, item_id


class JobListOut(Out):
    items: list[JobOut]
    next_cursor: str | None = Field(
        None, description="Pass as ?cursor= (with the same filters and order) for the next page."
    )
    total: int | None = Field(
        None,
        description="The jobs of every page: those the filters keep (null: a server that does not count them).",
    )


class JobAccepted(Out):
    job_id: str
    name: str
    tenant: str
    state: JobState
    duplicate: bool = Field(
        False, description="True when this Idempotency-Key was seen before: nothing new queued."
    )


class SpecCheckOut(Out):
    valid: bool = Field(description="Always true: an invalid spec is answered 422, as a submit would be.")
    spec: JobSpec = Field(description="The spec as it would be stored: its defaults filled in.")
    tenant: str = Field(description="The tenant the job would run for.")
    placeable: bool = Field(
        description="Whether a node heard from could ever hold it (true too while no node is heard from)."
    )
    message: str


class CancelOut(Out):
    job_id: str
    state: JobState
    cancel_requested: bool
    message: str


class JobEventOut(Out):
    version: int = Field(description="1 for the first event of the job, then one more per event.")
    event: dict[str, Any] = Field(description="The CloudEvent as stored.")


class WhyOut(Out):
    """`GET /v1/jobs/{id}/why`: what `gpuyard why` prints."""

    summary: str = Field(description="One sentence: where the job is and why.")
    rows: list[list[str]] = Field(description="[label, value] pairs: reason, numbers, position, estimate…")


# ---------------------------------------------------------------- tenants


class TenantOut(Out):
    tenant: str
    guaranteed_gpus: float = Field(
        description="Its quota: the GPUs it is guaranteed (GPUYARD_QUOTAS); 0: none."
    )
    used_gpus: float = Field(description="GPUs its placed and running jobs hold (a share as its fraction).")
    borrowed_gpus: float = Field(
        description="Of those, the GPUs of its jobs placed on another tenant's idle quota: the first to go."
    )
    queued: int = Field(description="Its jobs waiting to be placed.")
    placed: int = Field(description="Its jobs placed, not yet running.")
    running: int = Field(description="Its jobs running.")
    oldest_queued_seconds: float | None = Field(
        description="How long its oldest queued job has waited since it was submitted; null: none queued."
    )


class TenantListOut(Out):
    items: list[TenantOut] = Field(description="By tenant name.")


# ---------------------------------------------------------------- platform


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


class ServiceState(StrEnum):
    """How a service process is: what its supervisor (`gpuyard up`) says of it, else what its heartbeats say."""

    RUNNING = ProcessState.RUNNING.value
    RESTARTING = ProcessState.RESTARTING.value
    CRASH_LOOPING = ProcessState.CRASH_LOOPING.value
    REFUSED = ProcessState.REFUSED.value
    SILENT = "silent"
    """No heartbeat for three of its intervals, and no supervisor says why: it may be gone, or stuck."""


class ServiceOut(Out):
    service: str
    instance: str
    host: str
    pid: int
    version: str
    last_seen_seconds_ago: float = Field(
        description="Since its last heartbeat; for a process that never sent one, since its supervisor's last "
        "word about it."
    )
    state: ServiceState = Field(
        ServiceState.RUNNING,
        description="running; restarting (it exited and is started again), crash_looping (it exited again and "
        "again within a minute of starting: see last_error) or refused (its configuration), as its supervisor "
        "says of it and the processes it was before; silent: no heartbeat for a while, and no supervisor says "
        "why.",
    )
    restarts: int = Field(0, description="How many times its supervisor has started it again.")
    exit_code: int | None = Field(
        None,
        description="How its last exit ended, when it is not running: its exit status, or minus a signal.",
    )
    last_error: str | None = Field(
        None, description="The last line it wrote before that exit, when it is not running; null when none."
    )
    metrics: str | None = Field(
        None,
        description="The URL of its Prometheus /metrics, as its heartbeat says (e.g. "
        "http://10.0.0.7:9410/metrics); null where it serves none.",
    )


class DeadLetterOut(Out):
    seq: int
    consumer: str
    original_subject: str
    error: str
    deliveries: int | None = None
    event: dict[str, Any] | str


class ErrorOut(Out):
    """Every refusal but a request's validation (422, one reason per field) is this."""

    detail: str = Field(description="Why, for people.")


# ---------------------------------------------------------------- tokens


MAX_TOKEN_SECONDS = 100 * 365 * 86400.0
"""The longest a created token lives (`expires_in`): a longer one expires after this, well before the last date
a date can hold (year 9999)."""


RFC3339 = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"


def _rfc3339(value: Any) -> Any:
    """A time of a request's body as the schema's `date-time` says it: RFC 3339 text, with its offset (not a
    number of seconds, which pydantic would also read)."""
    if not isinstance(value, str) or not re.fullmatch(RFC3339, value):
        raise PydanticCustomError(
            "datetime_type", "a date and time with its timezone, such as 2030-01-01T00:00:00Z"
        )
    return value


Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


def _null_or_absent(field: str) -> list[dict[str, Any]]:
    """JSON Schema for: `field` is absent, or null."""
    return [{"not": {"required": [field]}}, {"properties": {field: {"type": "null"}}}]


class TokenIn(Strict):
    """A token to create (admin only): whom it stands for and, optionally, when it expires."""

    model_config = ConfigDict(  # `_one_expiry`'s rule in the schema: not both
        json_schema_extra={
            "dependentSchemas": {
                "expires_in": {"anyOf": _null_or_absent("expires_in") + _null_or_absent("expires_at")}
            }
        }
    )

    tenant: Name = Field(description="The tenant the token stands for.")
    user: Text = Field("", max_length=200, description="The user it stands for (shown on jobs).")
    admin: StrictBool = Field(False, description="An admin token sees every tenant and manages tokens.")
    expires_in: Seconds | None = Field(
        None,
        description="Expire after this long, e.g. '30d' or 3600 (at most 100 years: a longer one expires then).",
    )
    expires_at: Rfc3339 | None = Field(
        None, description="Expire at this time (with its time zone); one already past is refused (422)."
    )

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenIn:
        if self.expires_in is not None and self.expires_at is not None:
            raise ValueError("give expires_in or expires_at, not both")
        return self

    def past(self, now: datetime) -> str | None:
        """Why the token asked for could not be used, created at `now` (its expires_at already past), or None.
        (The schema cannot say it: it is a matter of when the request comes.)"""
        if self.expires_at is not None and self.expires_at <= now:
            return f"expires_at {self.expires_at.isoformat()} is already past"
        return None

    def expiry(self, now: datetime) -> datetime | None:
        """When the token expires, if it does, for one created at `now`."""
        return self.expires_at if self.expires_in is None else self.expiry_after(self.expires_in, now)

    @staticmethod
    def expiry_after(seconds: float | None, now: datetime) -> datetime | None:
        return None if seconds is None else now + timedelta(seconds=min(seconds, MAX_TOKEN_SECONDS))


class TokenOut(Out):
    """A token as listed: never the token nor its hash."""

    id: str = Field(description="What revokes it: DELETE /v1/admin/tokens/{id}.")
    tenant: str
    user: str
    admin: bool
    created: datetime | None = Field(None, description="None for a token written by hand or by the settings.")
    expires: datetime | None = Field(None, description="None: it does not expire.")
    inline: bool = Field(False, description="Set by GPUYARD_TOKENS (the settings): revoked there, not here.")


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token, shown this once: only its hash is kept.")


class HealthOut(Out):
    status: str
    service: str


# ---------------------------------------------------------------- models (docs/models.md)


class PublishedVersion(Out):
    """A published version as its publisher needs it: its number, digest, size and signature, not where the
    server keeps its file."""

    version: int
    sha256: str = Field(description="SHA-256 of the file, checked on every load.")
    size_bytes: int
    inputs: list[TensorSpec] = Field(
        description="The graph's inputs: name, v2 datatype, shape (-1: dynamic)."
    )
    outputs: list[TensorSpec]
    job_id: str | None = Field(None, description="The job that published it from inside, if one did.")
    user: str = Field("", description="Who published it (empty for a job).")
    published_at: datetime


class ModelVersionOut(PublishedVersion):
    """One published version of a model: immutable."""

    uri: str = Field(description="Where its ONNX file is in the model store.")


class ModelOut(Out):
    """A model and its listed versions, oldest first."""

    name: str
    tenant: str = Field(description="The tenant that owns it.")
    public: bool = Field(description="Every tenant may see and use it.")
    latest: int | None = Field(description="Its newest version.")
    versions: list[ModelVersionOut]
    created_at: datetime
    updated_at: datetime


class ModelSummaryOut(Out):
    name: str
    tenant: str
    public: bool
    latest: int | None
    versions: int = Field(description="How many versions are listed.")
    updated_at: datetime


class ModelListOut(Out):
    items: list[ModelSummaryOut] = Field(description="By tenant, then name.")


class DeploymentIn(Resources):
    """A deployment of a model version: `replicas` serve jobs, each with these resources (`gpus` may be a
    share of one GPU, e.g. 0.25), placed by the scheduler like any job."""

    version: Annotated[int, Field(ge=1, le=MAX_MODEL_VERSION), JSON_INTEGER] | None = Field(
        None, description="The version to serve (default: the newest published)."
    )
    replicas: Integer = Field(
        1, ge=1, le=MAX_DEPLOYMENT_REPLICAS, description="How many replicas (serve jobs)."
    )
    priority: Priority = Field(DEFAULT_PRIORITY, description=f"One of: {', '.join(PRIORITY_CLASSES)}.")

    def resources(self) -> Resources:
        """The resources of one replica."""
        return Resources.model_validate(self.model_dump(include=set(Resources.model_fields)))


class DeploymentAccepted(Out):
    """The serve jobs queued for a deployment, one per replica."""

    name: str = Field(description="The model's name.")
    tenant: str = Field(description="The tenant that owns the model.")
    version: int
    jobs: list[JobAccepted] = Field(description="One serve job per replica, named NAME:VERSION.")

    @property
    def job_ids(self) -> list[str]:
        return [j.job_id for j in self.jobs]


class ReplicaOut(Out):
    """One replica of a deployment: a serve job, as `gpuyard ps` shows it."""

    job_id: str
    tenant: str = Field(description="The tenant that runs it (whose quota it uses).")
    version: int
    state: JobState
    node: str | None = Field(None, description="Where it is placed, once placed.")
    gpus: float = Field(description="Its GPU share (0.25: a quarter of one GPU).")
    gpu_index: int | None = Field(None, description="The GPU it holds on its node, once placed.")
    pending: PendingOut | None = Field(None, description="Why it waits, while queued.")
    message: str = ""


class DeploymentListOut(Out):
    name: str
    tenant: str = Field(description="The tenant that owns the model.")
    replicas: list[ReplicaOut] = Field(description="The live serve jobs of the model, newest first.")


class UndeployedOut(Out):
    name: str
    tenant: str = Field(description="The tenant that owns the model.")
    cancelled: list[CancelOut] = Field(description="The serve jobs cancelled (or being stopped).")


class ModelPublishedOut(PublishedVersion):
    """The version published, or the one that already held these bytes (`duplicate`)."""

    name: str
    tenant: str
    public: bool
    duplicate: bool = Field(
        description="These bytes were published before: the version that holds them is answered, nothing new."
    )
    deployment: DeploymentAccepted | None = Field(
        None, description="The serve jobs queued for this version, when the call asked for `serve_*`."
    )


class ModelPatch(Strict):
    """What an owner (or an admin) may change of a model."""

    public: StrictBool = Field(description="true: every tenant may see and use it; false: its tenant's only.")


class ModelDeletedOut(Out):
    name: str
    tenant: str
    versions: list[int] = Field(description="The versions removed (their numbers are never given again).")


# ---------------------------------------------------------------- alerts (docs/alerts.md)


class AlertState(StrEnum):
    ACTIVE = "active"
    RESOLVED = "resolved"


class AlertStates(StrEnum):
    """Which alerts `GET /v1/alerts` lists."""

    ACTIVE = "active"
    RESOLVED = "resolved"
    ALL = "all"


class AlertOut(Out):
    """One occurrence of an alert: raised, and resolved once its condition cleared."""

    alert_id: str = Field(description="The rule and its subject, e.g. gpu_temperature/node-1/3.")
    kind: str = Field(description="The rule: gpu_idle, gpu_temperature, gpu_xid, node_lost, job_waiting…")
    severity: AlertSeverity
    state: AlertState
    message: str = Field(description="What happened, in plain words.")
    node: str | None = None
    gpu_index: int | None = None
    job_id: str | None = None
    tenant: str | None = Field(None, description="The tenant of the job it is about (none: admins only).")
    user: str | None = None
    value: float | None = Field(None, description="The figure that raised it (°C, W, %, minutes…).")
    threshold: float | None = Field(None, description="The rule's threshold that figure crossed.")
    raised_at: datetime
    resolved_at: datetime | None = None
    resolved_message: str = Field("", description="Why it was resolved.")


class AlertListOut(Out):
    items: list[AlertOut] = Field(description="Newest first (by when they were raised).")
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page.")


# ---------------------------------------------------------------- from the internal views


def job_out(view: JobView, place: int | None = None, now: datetime | None = None) -> JobOut:
    """The public form of a job's view; `place`: a queued job's place in line now (the queue's line,
    `shared/stores/readmodels/queueline.py`), said in its pending reason in place of the one it had when the reason was given."""
    queued = view.state == JobState.QUEUED
    active = not queued and not view.state.terminal
    return JobOut(
        job_id=view.job_id,
        name=view.name,
        tenant=view.tenant,
        user=view.user,
        spec=view.spec,
        state=view.state,
        attempt=view.attempt,
        gpus=view.gpus,
        created_at=view.created_at,
        updated_at=view.updated_at,
        started_at=view.started_at,
        finished_at=view.finished_at,
        pending=pending_out(view.pending, place, now) if queued and view.pending else None,
        not_before=view.not_before if queued else None,
        placements=[_public(PlacementOut, p) for p in view.placements],
        borrowed=view.borrowed,
        cancel_requested=view.cancel_requested,
        preemption=_preemption(view) if active else None,
        failure=_failure(view) if view.state == JobState.FAILED else None,
        message=view.message,
        attempts=[_public(AttemptOut, a) for a in view.attempts],
    )


def pending_out(pending: PendingReason, place: int | None, now: datetime | None = None) -> PendingOut:
    """A pending reason as the API says it: with the job's place in line now when the line holds it (a job
    out of line has none), its sentence rendered again with that place and the estimate from now."""
    out = _public(PendingOut, pending)
    if place is None or pending.position is None or not pending.text:  # (`text`: absent from older events)
        return out
    start_in = None
    if pending.estimated_start is not None:
        start_in = (pending.estimated_start - (now or datetime.now(UTC))).total_seconds()
    message = waiting_message(pending.text, place, start_in)
    return out.model_copy(update={"position": place, "message": message})


def _public(model: type[PublicModel], internal: BaseModel) -> PublicModel:
    """The public form of an internal model: its fields of the same names, nothing else (the rest stays the
    platform's business)."""
    return model.model_validate(internal, from_attributes=True)


def _preemption(view: JobView) -> PreemptionOut | None:
    asked = view.preempt_requested
    if asked is None:
        return None
    return PreemptionOut(reason=asked.reason, by_job=asked.by_job, grace_seconds=asked.grace_seconds)


def _failure(view: JobView) -> FailureOut | None:
    if view.failure_reason is None:
        return None
    failed = [e for e in view.exits if e.reason is not None]
    culprit = next((e for e in failed if e.reason == view.failure_reason), failed[0] if failed else None)
    return FailureOut(
        reason=view.failure_reason,
        message=view.message,
        exit_code=view.exit_code,
        signal=view.signal,
        replica=culprit.replica if culprit else None,
    )


# ---------------------------------------------------------------- rendering


def pending_text(pending: PendingOut) -> str:
    """A pending reason in one line, as `describe`, `why`, `ps` and the dashboard show it:
    'insufficient_gpus: needs 4 GPUs on one node; …; 2nd in line' (the message says the place)."""
    return f"{pending.code.value}: {pending.message}"


def replica_out(job: JobOut) -> ReplicaOut:
    """A serve job as one replica of its model's deployment."""
    assert job.spec.serve is not None, "not a serve job"
    placed = job.placements[0] if job.placements and not job.state.terminal else None
    gpu = placed.gpus[0] if placed and placed.gpus else None
    return ReplicaOut(
        job_id=job.job_id,
        tenant=job.tenant,
        version=job.spec.serve.version,
        state=job.state,
        node=placed.node if placed else None,
        gpus=job.spec.resources.gpus,
        gpu_index=gpu.index if gpu else None,
        pending=job.pending,
        message=job.message,
    )


class UsageBy(StrEnum):
    TENANT = "tenant"
    USER = "user"
    JOB = "job"


class UsageRowOut(Out):
    tenant: str
    user: str | None = Field(None, description="With by=user or by=job.")
    job_id: str | None = Field(None, description="With by=job.")
    jobs: int = Field(description="Jobs counted in the row.")
    allocated_gpu_hours: float = Field(description="GPU share × time placed or running, in the window.")
    used_gpu_hours: float = Field(description="Allocated GPU time weighted by the GPUs' utilization.")
    waste_gpu_hours: float = Field(description="Allocated − used (at least 0).")


class UsageOut(Out):
    since: datetime
    until: datetime
    by: UsageBy
    rows: list[UsageRowOut]


class GpuPointOut(Out):
    """One GPU over `seconds` from `t`: its figures are means over them."""

    node: str
    gpu: int
    t: datetime
    seconds: float
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int = 0
    holders: list[GpuHolderOut] = Field(default_factory=list)


class GpuHistoryOut(Out):
    node: str
    since: datetime
    until: datetime
    step_seconds: float = Field(description="Seconds each point stands for (at least the stored resolution).")
    points: list[GpuPointOut]


class JobGpuOut(Out):
    job_id: str
    allocated_gpu_hours: float
    used_gpu_hours: float
    mean_utilization_pct: float | None = Field(
        None,
        description="Mean utilization of its GPUs over its run, from the GPU history (None: no samples).",
    )
    peak_memory_used_bytes: int | None = None
    step_seconds: float
    points: list[GpuPointOut] = Field(
        description="Its GPUs over its run (the history keeps 7 days by default)."
    )
