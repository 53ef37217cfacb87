"""The executor's names for an attempt and for how one of its replicas ended, shared by both backends.

`AttemptKey` is the one key of an attempt everywhere in the executor (its registry, the backends, the claims,
the Kubernetes controller); it is a tuple, so `(job_id, attempt)` finds the same entry. A replica's end,
whoever saw it (a local process that exited, a pod that finished or was deleted, a replica that could not
start), is the `job.replica_exited` event's own model, made by `replica_exit`: no second model of it.

A replica that could not start for the node's fault, not the job's (the node's disk full), is no end of the
job's: the backend's launch raises `NodeFault`, and the executor requeues the attempt as a new one, as it does
an attempt whose processes it lost (`JobLedger.requeue_lost`), however many retries the job allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gpuyard.shared.contracts.events.jobs import FailureReason, JobReplicaExited

ReplicaKey = tuple[str, int, int]
"""(job id, attempt, replica)."""


class AttemptKey(NamedTuple):
    job_id: str
    attempt: int


def replica_exit(
    job_id: str,
    attempt: int,
    replica: int,
    node: str,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    reason: FailureReason | None = None,
    message: str = "",
    log_tail: Sequence[str] = (),
) -> JobReplicaExited:
    """How a replica ended (`reason` None: it exited with code 0), as the executor records it: the last lines
    of its output are kept only when it failed, for the cause."""
    return JobReplicaExited(
        job_id=job_id,
        attempt=attempt,
        node=node,
        replica=replica,
        exit_code=exit_code,
        signal=signal,
        reason=reason,
        message=message,
        log_tail=list(log_tail) if reason else [],
    )


class NodeFault(Exception):
    """A replica of the attempt could not start for the node's fault (its disk full: ENOSPC): nothing of the
    attempt was left running here, and the attempt is requeued, not failed. `replica`: which (None: the attempt
    as a whole, such as its claim); `message`: why, in plain words."""

    def __init__(self, replica: int | None, message: str):
        super().__init__(message)
        self.replica = replica
        self.message = message


def attempt_key(exited: JobReplicaExited) -> AttemptKey:
    return AttemptKey(exited.job_id, exited.attempt)
