"""How attempts stop and end, one definition each: why a host stops an attempt's replicas (`StopReason`), why
the scheduler preempts an attempt (`PreemptionCause`, with its sentence for people), and how an attempt ended
(`AttemptOutcome`). Why a job failed is `FailureReason`, why it was queued again `RequeueReason` (both in
`gpuyard.shared.contracts.events.jobs`, with the events that carry them)."""

from __future__ import annotations

import re
from enum import StrEnum


class StopReason(StrEnum):
    """Why a node's host (the executor, the serving service) stops the replicas of an attempt: the first
    reason given wins and says how the attempt ends."""

    CANCELLED = "cancelled"
    """The job's cancel: the attempt ends `cancelled`."""
    PREEMPTED = "preempted"
    """The attempt's preemption (`job.preempted`): it is queued again as a new attempt."""
    TIMEOUT = "timeout"
    """Its spec's time limit passed: it fails, reason `timeout`."""
    IDLE = "idle"
    """The monitor's idle stop: it fails, reason `idle`."""
    GPU_MEMORY = "gpu_memory"
    """A replica used more GPU memory than its slice: it fails, reason `gpu_memory_exceeded`."""
    PEER_FAILED = "peer_failed"
    """Another replica of its gang failed: it ends as that one's failure says."""
    ENDED = "ended"
    """Its end is recorded already (by anyone): what is left of it is stopped."""


ASKED_STOPS: frozenset[StopReason] = frozenset({StopReason.CANCELLED, StopReason.PREEMPTED})
"""The stops a job's event asks of a host (a cancel, a preemption): the attempt ends so, however its replicas
end, even one stopped while it was still starting or loading."""

STOPS_AWAITING_EVERY_REPLICA: frozenset[StopReason] = ASKED_STOPS | {StopReason.IDLE}
"""Stops whose attempt ends only once every replica of it on the node is gone (the others end it as soon as
its replicas' exits say how)."""


class PreemptionCause(StrEnum):
    """Why the scheduler preempts a running attempt (`job.preempted`): it is stopped within its grace period and
    queued again as a new attempt."""

    PRIORITY = "priority"
    """A waiting job of a higher priority needs its GPUs."""
    RECLAIM = "reclaim"
    """It runs on another tenant's idle quota, and that tenant takes its quota back."""
    DRAIN = "drain"
    """An admin drains its node (or one of its GPUs)."""
    OTHER = "other"
    """A cause this release does not name (an event of an older one): its words are the event's message."""


def preemption_text(cause: PreemptionCause, node: str | None = None, message: str = "") -> str:
    """A preemption in words, from its cause: 'drain: node n1 is being drained'. An `other` cause is its
    message; a message given with a named cause is added in parentheses."""
    if cause == PreemptionCause.OTHER:
        return message or "preempted"
    if cause == PreemptionCause.DRAIN:
        text = f"drain: node {node} is being drained" if node else "drain: its node is being drained"
    elif cause == PreemptionCause.RECLAIM:
        text = "reclaim: the tenant whose idle quota it borrowed takes it back"
    else:
        text = "priority: a job of a higher priority needs its GPUs"
    return f"{text} ({message})" if message else text


_DRAINED = re.compile(r"^drain: node (?P<node>\S+) is being drained$")


def read_preemption_text(text: str) -> tuple[PreemptionCause, str | None, str]:
    """(cause, node, message) of a preemption's reason as earlier releases wrote it (free text): the known
    forms ('priority', 'reclaim', 'drain: node N is being drained') by their cause, anything else `other` with
    the text kept as its message."""
    text = text.strip()
    if (drained := _DRAINED.match(text)) is not None:
        return PreemptionCause.DRAIN, drained["node"], ""
    if text in (PreemptionCause.PRIORITY, PreemptionCause.RECLAIM):
        return PreemptionCause(text), None, ""
    return PreemptionCause.OTHER, None, text


class AttemptOutcome(StrEnum):
    """How one attempt of a job ended."""

    SUCCEEDED = "succeeded"
    """Every replica exited 0."""
    FAILED = "failed"
    """It failed (`failure` says why) and the job with it."""
    CANCELLED = "cancelled"
    """The job was cancelled."""
    PREEMPTED = "preempted"
    """It was preempted (`preemption` says why) and the job queued again as a new attempt."""
    REQUEUED = "requeued"
    """The job was queued again as a new attempt for another reason (`requeue`: a retry, a lost node…)."""
