"""Jobs as the API shows them: a job, its attempts, placements, pending reason, failure; lists, acceptance, checks, cancel, events, why."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import Field, model_validator

from gpuyard.shared.contracts.api.common import Out, _public
from gpuyard.shared.contracts.api.tenants import Rfc3339
from gpuyard.shared.contracts.events.jobs import (
    MAX_CHECKPOINT_NUMBER,
    FailureReason,
    PendingReason,
    RequeueReason,
)
from gpuyard.shared.contracts.fieldtypes import JSON_INTEGER, Strict
from gpuyard.shared.contracts.jobspec import (
    JobSpec,
)
from gpuyard.shared.contracts.jobstate import JobState, JobView, read_outcome_text
from gpuyard.shared.contracts.reasons import PendingCode, waiting_message
from gpuyard.shared.contracts.stops import AttemptOutcome, PreemptionCause, read_preemption_text


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
    """A running job being stopped to make room (or to empty a drained node); it is queued again as a new
    attempt."""

    cause: PreemptionCause = Field(description="Why, for machines: one of the preemption causes.")
    node: str | None = Field(None, description="The node the cause names (the drained one), when one.")
    reason: str = Field(description="Why, for people: the sentence rendered from the cause and its node.")
    by_job: str | None = Field(None, description="The job it makes room for, if one.")
    grace_seconds: float
    lost_work_seconds: float | None = Field(
        None,
        description="The work the attempt loses, in seconds: since its latest checkpoint, or since it started "
        "without one; None where not known.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_reason(cls, data: Any) -> Any:
        """An earlier server's answer (its reason alone, in words): the cause read from it."""
        if isinstance(data, dict) and "cause" not in data and isinstance(data.get("reason"), str):
            cause, node, _ = read_preemption_text(data["reason"])
            return {**data, "cause": cause, "node": node}
        return data


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
    outcome: AttemptOutcome | None = Field(
        None,
        description="How it ended: succeeded, failed, cancelled, preempted or requeued; None while in progress.",
    )
    failure: FailureReason | None = Field(None, description="Why it failed (a failed attempt).")
    requeue: RequeueReason | None = Field(
        None, description="Why the job was queued again (a requeued or preempted attempt)."
    )
    preemption: PreemptionCause | None = Field(
        None, description="Why it was preempted (a preempted attempt)."
    )
    node: str | None = Field(None, description="The node its preemption names (a drained one).")
    summary: str | None = Field(
        None,
        description="How it ended, short, for people: 'succeeded', 'failed: cuda_oom', 'requeued: node_lost', "
        "'preempted: drain'; None while in progress.",
    )
    exit_code: int | None = None
    message: str = ""
    notes: list[str] = Field(default_factory=list, description="What the nodes could not do for it.")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return read_outcome_text(data)  # (an earlier server's answer: its outcome in words)


class CheckpointOut(Out):
    """The latest checkpoint the job reported (`gpuyard.checkpoint.save`, docs/storage.md)."""

    step: int = Field(description="The step it holds, as the job counts them.")
    saved_at: datetime = Field(description="When the job finished writing it.")
    size_bytes: int = Field(description="Its size on disk.")
    attempt: int = Field(description="The attempt that saved it.")


CheckpointNumber = Annotated[int, Field(ge=0, le=MAX_CHECKPOINT_NUMBER), JSON_INTEGER]


class CheckpointIn(Strict):
    """What a job reports of a checkpoint it saved (`POST /v1/jobs/{id}/checkpoints`, with its checkpoint token)."""

    step: CheckpointNumber = Field(description="The step it holds, as the job counts them.")
    size_bytes: CheckpointNumber = Field(description="Its size on disk.")
    saved_at: Rfc3339 | None = Field(
        None,
        description="When the job finished writing it, with its time zone (default: when the report arrives).",
    )


class CheckpointAccepted(Out):
    job_id: str
    attempt: int
    step: int
    duplicate: bool = Field(False, description="True when this very report was recorded before.")


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
    checkpoint: CheckpointOut | None = Field(
        None, description="The latest checkpoint it reported, whichever attempt saved it."
    )


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
        attempts=[_public(AttemptOut, a) for a in view.attempts],  # (`summary`: Attempt's property)
        checkpoint=_public(CheckpointOut, view.checkpoint) if view.checkpoint else None,
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


def _preemption(view: JobView) -> PreemptionOut | None:
    asked = view.preempt_requested
    if asked is None:
        return None
    return PreemptionOut(
        cause=asked.cause,
        node=asked.node,
        reason=asked.text,
        by_job=asked.by_job,
        grace_seconds=asked.grace_seconds,
        lost_work_seconds=asked.lost_work_seconds,
    )


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


def pending_text(pending: PendingOut) -> str:
    """A pending reason in one line, as `describe`, `why`, `ps` and the dashboard show it:
    'insufficient_gpus: needs 4 GPUs on one node; …; 2nd in line' (the message says the place)."""
    return f"{pending.code.value}: {pending.message}"
