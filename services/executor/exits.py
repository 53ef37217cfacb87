"""The executor's names for an attempt and for how one of its replicas ended, shared by both backends.

`AttemptKey` is the one key of an attempt everywhere in the executor (its registry, the backends, the claims,
the Kubernetes controller); it is a tuple, so `(job_id, attempt)` finds the same entry. `ReplicaExit` is the
one model of a replica's end, whoever saw it: a local process that exited, a pod that finished or was
deleted, a replica that could not start. The executor records it as `job.replica_exited` (`event`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from shared.events import FailureReason, JobReplicaExited

ReplicaKey = tuple[str, int, int]
"""(job id, attempt, replica)."""


class AttemptKey(NamedTuple):
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ReplicaExit:
    job_id: str
    attempt: int
    replica: int
    node: str
    exit_code: int | None = None
    signal: int | None = None
    reason: FailureReason | None = None
    """None: it exited with code 0."""
    message: str = ""
    log_tail: Sequence[str] = ()
    """The last lines of its output, for a failure's cause (kept only when it failed)."""

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)

    def event(self) -> JobReplicaExited:
        return JobReplicaExited(
            job_id=self.job_id,
            attempt=self.attempt,
            node=self.node,
            replica=self.replica,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=self.reason,
            message=self.message,
            log_tail=list(self.log_tail) if self.reason else [],
        )
