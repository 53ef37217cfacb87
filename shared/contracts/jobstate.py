"""The job state machine: a table of legal transitions (`TRANSITIONS`), a table of what each event changes
(`APPLIERS`), and a pure fold of events into the job's view.

    queued ──placed──▶ placed ──started──▶ running ──succeeded──▶ succeeded
      ▲                  │                   │ └─────failed─────▶ failed
      └────requeued──────┴───────────────────┘ (retry, preemption, lost node: a new attempt)
    queued/placed/running ──cancelled──▶ cancelled

Events that belong to an older attempt (a late exit of a replica that was already requeued, say) are refused
as stale; every refusal names the offending event so that it can be logged.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    JobCancelled,
    JobCancelRequested,
    JobCheckpointed,
    JobExecStarted,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    PendingReason,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.stops import AttemptOutcome, PreemptionCause


class JobState(StrEnum):
    QUEUED = "queued"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


Q, P, R = JobState.QUEUED, JobState.PLACED, JobState.RUNNING
# subject -> (states it may arrive in, state it leads to; None keeps the state)
TRANSITIONS: dict[Subject, tuple[frozenset[JobState], JobState | None]] = {
    Subject.JOB_PENDING: (frozenset({Q}), None),
    Subject.JOB_PLACED: (frozenset({Q}), P),
    Subject.JOB_STARTED: (frozenset({P, R}), R),
    Subject.JOB_REPLICA_EXITED: (frozenset({P, R}), None),
    Subject.JOB_SUCCEEDED: (frozenset({R}), JobState.SUCCEEDED),
    Subject.JOB_FAILED: (frozenset({P, R}), JobState.FAILED),
    Subject.JOB_CANCEL_REQUESTED: (frozenset({Q, P, R}), None),
    Subject.JOB_CANCELLED: (frozenset({Q, P, R}), JobState.CANCELLED),
    Subject.JOB_PREEMPTED: (frozenset({P, R}), None),
    Subject.JOB_REQUEUED: (frozenset({P, R}), Q),
    Subject.JOB_CHECKPOINTED: (frozenset({P, R}), None),
    Subject.JOB_EXEC_STARTED: (frozenset({R}), None),
}

# The state sets every module uses (one definition: none spells its own), read off the table above.
LIVE_STATES: frozenset[JobState] = frozenset().union(*(arrive_in for arrive_in, _ in TRANSITIONS.values()))
"""A job not yet ended: the states some event may still arrive in (queued, placed, running)."""
TERMINAL_STATES: frozenset[JobState] = frozenset(JobState) - LIVE_STATES
"""A job that ended: no event leads out of these (succeeded, failed, cancelled)."""
ACTIVE_STATES: frozenset[JobState] = LIVE_STATES - {JobState.QUEUED}
"""A live job placed on its nodes: it holds its GPUs (placed, running)."""


def in_order(states: Collection[JobState]) -> list[JobState]:
    """`states` in the machine's order (queued, placed, running, succeeded…): for a listing or a query."""
    return [state for state in JobState if state in states]


def state_values(states: Collection[JobState]) -> list[str]:
    """The plain values of `states`, in the machine's order: what the event store's queries take."""
    return [state.value for state in in_order(states)]


class IllegalTransition(Exception):
    """An event that the job's current state does not allow. Carries the event for the log."""

    def __init__(self, message: str, event: CloudEvent):
        super().__init__(message)
        self.event = event


class StaleEvent(IllegalTransition):
    """An event of an attempt that is no longer the current one."""


class ReplicaExit(BaseModel):
    model_config = ConfigDict(frozen=True)
    replica: int
    node: str
    exit_code: int | None = None
    signal: int | None = None
    reason: FailureReason | None = None
    message: str = ""


class Attempt(BaseModel):
    """One try at running the job: where it ran and how it ended."""

    number: int
    queued_at: datetime
    placed_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    nodes: list[str] = Field(default_factory=list)
    started: list[int] = Field(default_factory=list)  # the replicas whose processes started
    outcome: AttemptOutcome | None = None  # None while in progress
    failure: FailureReason | None = None  # why it failed (a failed attempt)
    requeue: RequeueReason | None = None  # why the job was queued again (a requeued or preempted attempt)
    preemption: PreemptionCause | None = None  # why it was preempted (a preempted attempt)
    node: str | None = None  # the node its preemption names (a drained one)
    exit_code: int | None = None
    message: str = ""
    notes: list[str] = Field(default_factory=list)  # what the nodes could not do (JobStarted.notes)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return read_outcome_text(data)

    @property
    def summary(self) -> str | None:
        """How it ended, short: 'succeeded', 'failed: cuda_oom', 'requeued: node_lost', 'preempted: drain';
        None while in progress."""
        if self.outcome is None:
            return None
        why = {
            AttemptOutcome.FAILED: self.failure,
            AttemptOutcome.REQUEUED: self.requeue,
            AttemptOutcome.PREEMPTED: self.preemption,
        }.get(self.outcome)
        return f"{self.outcome}: {why}" if why is not None else self.outcome.value


def read_outcome_text(data: Any) -> Any:
    """An attempt (a dict) as an earlier release stored or sent it, saying how it ended in text ('failed:
    cuda_oom', 'requeued: preempted'), with its outcome and reason as fields instead (and that text as its
    `summary`); anything else as it is."""
    outcome = data.get("outcome") if isinstance(data, dict) else None
    if not isinstance(outcome, str) or ": " not in outcome:
        return data
    said, _, why = outcome.partition(": ")
    upgraded = {"summary": outcome, **data, "outcome": said}
    if said == AttemptOutcome.FAILED:
        upgraded["failure"] = FailureReason._value2member_map_.get(why)
    elif said == AttemptOutcome.REQUEUED:
        upgraded["requeue"] = requeue = RequeueReason._value2member_map_.get(why)
        if requeue == RequeueReason.PREEMPTED:
            upgraded["outcome"] = AttemptOutcome.PREEMPTED
    return upgraded


class Checkpoint(BaseModel):
    """The latest checkpoint a job reported (`job.checkpointed`)."""

    model_config = ConfigDict(frozen=True)
    step: int
    saved_at: datetime
    size_bytes: int
    attempt: int
    reported_at: datetime | None = None  # when the platform recorded it (its event's time)


class JobView(BaseModel):
    """The current state of one job, derived only from its events (the projection stored for listing)."""

    job_id: str
    name: str
    tenant: str
    user: str
    spec: JobSpec
    state: JobState
    version: int = 0
    attempt: int = 1
    created_at: datetime
    updated_at: datetime
    placements: list[ReplicaPlacement] = Field(default_factory=list)
    borrowed: bool = False  # the current placement runs on another tenant's idle quota
    pending: PendingReason | None = None
    not_before: datetime | None = None
    cancel_requested: bool = False
    preempt_requested: JobPreempted | None = None
    exits: list[ReplicaExit] = Field(default_factory=list)
    exit_code: int | None = None
    signal: int | None = None
    failure_reason: FailureReason | None = None
    message: str = ""
    log_tail: list[str] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    checkpoint: Checkpoint | None = None  # the latest one reported, whichever attempt saved it

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    # Derived fields, in the job's documents and answers. mypy does not follow pydantic's computed field over a
    # property (pydantic's own spelling); a cached_property would keep a stale value through `model_copy`.
    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpus(self) -> float:
        return self.spec.resources.gpus * self.spec.replicas

    @computed_field  # type: ignore[prop-decorator]
    @property
    def started_at(self) -> datetime | None:
        return self.current.started_at if self.attempts else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def finished_at(self) -> datetime | None:
        return self.current.ended_at if self.state.terminal else None


def fold(events: list[CloudEvent]) -> JobView | None:
    """Replay a job's events from the start; raises IllegalTransition on the first illegal one."""
    view: JobView | None = None
    for version, ev in enumerate(events, start=1):
        view = apply(view, ev, version=version)
    return view


def check(view: JobView | None, ev: CloudEvent) -> Subject:
    """Refuse an event the state machine does not allow, without applying it; returns its subject."""
    subject = ev.nats_subject
    if subject == Subject.JOB_SUBMITTED:
        if view is not None:
            raise IllegalTransition(f"job {view.job_id} was already submitted", ev)
        return subject
    if view is None:
        raise IllegalTransition(f"{subject} for a job that was never submitted ({ev.subject})", ev)
    rule = TRANSITIONS.get(subject)
    if rule is None:
        raise IllegalTransition(f"{subject} is not a job event", ev)
    allowed, _ = rule
    attempt = getattr(ev.data, "attempt", None)
    if attempt is not None:
        expected = view.attempt + 1 if subject == Subject.JOB_REQUEUED else view.attempt
        if attempt != expected:
            raise StaleEvent(
                f"{subject} for attempt {attempt} of job {view.job_id}, whose current attempt is {view.attempt}",
                ev,
            )
    if view.state not in allowed:
        raise IllegalTransition(f"{subject} is not allowed for job {view.job_id} in state {view.state}", ev)
    return subject


def apply(view: JobView | None, ev: CloudEvent, *, version: int | None = None) -> JobView:
    """Return the job's view after `ev` (a new object); raise IllegalTransition if `ev` is not allowed."""
    subject = check(view, ev)
    data = ev.data
    if isinstance(data, JobSubmitted):
        return _submitted(data, ev.time, version)
    assert view is not None
    # The changes go into one shallow copy of the view (and of the current attempt): the rest is shared and
    # never mutated; a deep copy of the spec on every event would be most of the cost of a write.
    changes: dict = {"version": version if version is not None else view.version + 1, "updated_at": ev.time}
    _, target = TRANSITIONS[subject]
    if target is not None:
        changes["state"] = target
    applier = APPLIERS.get(type(data))
    attempt = applier(view, data, ev.time, changes) if applier is not None else {}
    if attempt:
        changes["attempts"] = [*view.attempts[:-1], view.current.model_copy(update=attempt)]
    return view.model_copy(update=changes)


def _submitted(data: JobSubmitted, at: datetime, version: int | None) -> JobView:
    return JobView(
        job_id=data.job_id,
        name=data.name,
        tenant=data.tenant,
        user=data.user,
        spec=data.spec,
        state=JobState.QUEUED,
        version=version or 1,
        created_at=at,
        updated_at=at,
        attempts=[Attempt(number=1, queued_at=at)],
    )


# ------------------------------------------------------------------ what each event changes
# Each applier adds what its event changes in the job's view to `changes` and returns the changes to the
# current attempt (empty: none). The state and the version are `apply`'s, from TRANSITIONS.


def _pending(view: JobView, data: JobPending, at: datetime, changes: dict) -> dict:
    changes["pending"] = data.reason
    return {}


def _placed(view: JobView, data: JobPlaced, at: datetime, changes: dict) -> dict:
    # the message said why the previous attempt ended (a drain, a preemption): stale once placed again
    changes.update(placements=list(data.placements), borrowed=data.borrowed, pending=None, message="")
    return {"placed_at": at, "nodes": data.nodes}


def _started(view: JobView, data: JobStarted, at: datetime, changes: dict) -> dict:
    current = view.current
    attempt: dict = {} if current.started_at is not None else {"started_at": at}
    attempt["started"] = sorted({*current.started, *data.replicas})
    attempt["notes"] = [*current.notes, *(n for n in data.notes if n not in current.notes)]
    return attempt


def _replica_exited(view: JobView, data: JobReplicaExited, at: datetime, changes: dict) -> dict:
    exited = ReplicaExit(
        replica=data.replica,
        node=data.node,
        exit_code=data.exit_code,
        signal=data.signal,
        reason=data.reason,
        message=data.message,
    )
    changes["exits"] = [*view.exits, exited]
    if data.log_tail:
        changes["log_tail"] = list(data.log_tail)
    return {}


def _succeeded(view: JobView, data: JobSucceeded, at: datetime, changes: dict) -> dict:
    # what an earlier attempt's end said is in that attempt, not the job's word
    changes.update(exit_code=0, signal=None, failure_reason=None, message="")
    return _ended(at, AttemptOutcome.SUCCEEDED, 0)


def _failed(view: JobView, data: JobFailed, at: datetime, changes: dict) -> dict:
    changes.update(
        exit_code=data.exit_code, signal=data.signal, failure_reason=data.reason, message=data.message
    )
    if data.log_tail:
        changes["log_tail"] = list(data.log_tail)
    return {**_ended(at, AttemptOutcome.FAILED, data.exit_code, data.message), "failure": data.reason}


def _cancel_requested(view: JobView, data: JobCancelRequested, at: datetime, changes: dict) -> dict:
    changes["cancel_requested"] = True
    return {}


def _cancelled(view: JobView, data: JobCancelled, at: datetime, changes: dict) -> dict:
    changes["message"] = message = data.message or f"cancelled by {data.by}"
    return _ended(at, AttemptOutcome.CANCELLED, None, message)


def _preempted(view: JobView, data: JobPreempted, at: datetime, changes: dict) -> dict:
    changes["preempt_requested"] = data
    return {}


def _requeued(view: JobView, data: JobRequeued, at: datetime, changes: dict) -> dict:
    """The current attempt ends (in `attempts`, as it was) and a new one, queued, begins."""
    ended = view.current.model_copy(update=_requeue_end(view, data, at))
    changes.update(
        attempt=data.attempt,
        attempts=[*view.attempts[:-1], ended, Attempt(number=data.attempt, queued_at=at)],
        placements=[],
        exits=[],
        pending=None,
        borrowed=False,
        preempt_requested=None,
        not_before=data.not_before,
        message=data.message,
    )
    return {}


def _checkpointed(view: JobView, data: JobCheckpointed, at: datetime, changes: dict) -> dict:
    changes["checkpoint"] = Checkpoint(
        step=data.step,
        saved_at=data.saved_at,
        size_bytes=data.size_bytes,
        attempt=data.attempt,
        reported_at=at,
    )
    return {}


Applier = Callable[[JobView, Any, datetime, dict], dict]
"""`(view, the event's data, its time, the changes to the view) -> the changes to the current attempt`."""

APPLIERS: dict[type[EventData], Applier] = {
    JobPending: _pending,
    JobPlaced: _placed,
    JobStarted: _started,
    JobReplicaExited: _replica_exited,
    JobSucceeded: _succeeded,
    JobFailed: _failed,
    JobCancelRequested: _cancel_requested,
    JobCancelled: _cancelled,
    JobPreempted: _preempted,
    JobRequeued: _requeued,
    JobCheckpointed: _checkpointed,
    JobExecStarted: lambda view, data, at, changes: changes,  # (an audit record: the view stays as it is)
}
"""What each job event (but `job.submitted`, which makes the view) changes: the machine's second table."""


def _ended(at: datetime, outcome: AttemptOutcome, exit_code: int | None, message: str = "") -> dict:
    """The changes to an attempt that ends."""
    return {"ended_at": at, "outcome": outcome, "exit_code": exit_code, "message": message}


def _requeue_end(view: JobView, data: JobRequeued, at: datetime) -> dict:
    """The changes to an attempt that ends by a requeue: `preempted` (with the preemption's cause and node)
    when it was preempted, else `requeued`."""
    if data.reason != RequeueReason.PREEMPTED:
        return {**_ended(at, AttemptOutcome.REQUEUED, data.exit_code, data.message), "requeue": data.reason}
    ended = _ended(at, AttemptOutcome.PREEMPTED, data.exit_code, data.message)
    asked = view.preempt_requested
    if asked is not None:
        ended.update(preemption=asked.cause, node=asked.node)
    return {**ended, "requeue": data.reason}
