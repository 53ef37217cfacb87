"""What a replica's end means, and how an attempt ends: pure decisions, no I/O.

- `classify_log_tail`: failure causes that only a job's output reveals (both backends);
- `classify_exit`: a local process's return code → its cause in plain words;
- `node_fault`: a start that failed for the node's fault (its disk full), not the job's;
- `exit_after_stop`: a replica the executor stopped (timeout, GPU memory slice, idle GPUs) fails for that
  reason, not for the signal that stopped it;
- `attempt_end`: from the job's view (its replicas' exits), the event that ends the attempt, if any.
"""

from __future__ import annotations

import errno
import re
import signal
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from gpuyard.services.executor.cgroups import ENTER_FAILED
from gpuyard.services.executor.logfile import NO_SPACE
from gpuyard.shared.contracts.events.envelope import EventData
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    JobCancelled,
    JobFailed,
    JobReplicaExited,
    JobRequeued,
    JobSucceeded,
    RequeueReason,
)
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobState, JobView
from gpuyard.shared.contracts.stops import StopReason
from gpuyard.shared.contracts.units import format_size

_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)
_SIGNALS = signal.Signals._value2member_map_


def classify_log_tail(lines: Iterable[str]) -> FailureReason | None:
    """CUDA_OOM when the output shows the GPU ran out of memory, else None (nothing recognised)."""
    return FailureReason.CUDA_OOM if any(_CUDA_OOM.search(line) for line in lines) else None


def classify_exit(
    returncode: int,
    tail: list[str],
    shell: bool,
    *,
    oom_killed: bool = False,
    memory_bytes: int = 0,
) -> tuple[FailureReason | None, int | None, int | None, str]:
    """(reason, exit_code, signal, message) for a process's return code; reason None means success."""
    if returncode == 0:
        return None, 0, None, ""
    sig = -returncode if returncode < 0 else None
    code = returncode if returncode >= 0 else None
    if oom_killed:
        limit = f" ({format_size(memory_bytes)})" if memory_bytes else ""
        return FailureReason.OOM_KILLED, code, sig, f"killed for exceeding its memory limit{limit}"
    if sig is not None:
        name = signal.Signals(sig).name if sig in _SIGNALS else f"signal {sig}"
        if sig == signal.SIGKILL:
            return FailureReason.SIGNAL, None, sig, f"killed by {name} (out of memory, or killed by someone)"
        return FailureReason.SIGNAL, None, sig, f"killed by {name}"
    if returncode == 125 and any(ENTER_FAILED in line for line in tail):
        return (
            FailureReason.START_FAILED,
            returncode,
            None,
            "could not enter its cgroup (CPU and memory limits)",
        )
    if classify_log_tail(tail) == FailureReason.CUDA_OOM:
        return FailureReason.CUDA_OOM, returncode, None, "CUDA out of memory (seen in the log)"
    if shell and returncode == 127:
        return (
            FailureReason.COMMAND_NOT_FOUND,
            returncode,
            None,
            "command not found (exit code 127 from the shell)",
        )
    if returncode > 128 and returncode - 128 in _SIGNALS:
        name = signal.Signals(returncode - 128).name
        return (
            FailureReason.EXIT_CODE,
            returncode,
            None,
            f"exited with code {returncode} (a child got {name})",
        )
    return FailureReason.EXIT_CODE, returncode, None, f"exited with code {returncode}"


def node_fault(exc: BaseException) -> str | None:
    """Why a replica's start failed for the node's fault, in plain words, or None when the failure may be the
    job's own (its command, its working directory): the node's disk is full or over its quota (ENOSPC,
    EDQUOT), for the replica's folders, its log, its pid file or its cgroup. Such a start is tried again as a
    new attempt, never counted against the job."""
    if not isinstance(exc, OSError) or exc.errno not in NO_SPACE:
        return None
    if exc.errno == errno.EDQUOT:
        return "the platform's disk quota on the node is used up"
    return "no space left on the node's disk"


def exit_after_stop(
    ended: JobReplicaExited, stop: StopReason | None, message: str, timeout: float | None
) -> JobReplicaExited:
    """The exit to record for a replica that ended while its attempt was being stopped for `stop`."""
    if stop == StopReason.TIMEOUT:
        why = f"timed out after {timeout:g}s and was stopped" if timeout else "timed out"
        return ended.model_copy(update={"reason": FailureReason.TIMEOUT, "message": why})
    if stop == StopReason.IDLE:
        return ended.model_copy(
            update={"reason": FailureReason.IDLE, "message": message or "stopped for idle GPUs"}
        )
    if stop == StopReason.GPU_MEMORY:
        return ended.model_copy(
            update={
                "reason": FailureReason.GPU_MEMORY_EXCEEDED,
                "message": message or "used more GPU memory than its slice",
            }
        )
    return ended


def attempt_end(
    view: JobView | None, attempt: int, stop: StopReason | None, retry_backoff: float
) -> EventData | None:
    """How the attempt ended, once its replicas' exits say so: cancelled, requeued (preempted, or a retry with
    backoff), failed (its first failed replica's cause), succeeded (every replica exited 0). None: not yet, or
    no longer this attempt's to say (another attempt, or already ended)."""
    if view is None or view.attempt != attempt or view.state not in ACTIVE_STATES:
        return None
    job_id = view.job_id
    if stop == StopReason.CANCELLED or view.cancel_requested:
        return JobCancelled(job_id=job_id, attempt=attempt, by="executor", message="cancelled while running")
    if stop == StopReason.PREEMPTED:
        return preempted_requeue(view, attempt)
    failed = [e for e in view.exits if e.reason is not None]
    idle = next((e for e in failed if e.reason == FailureReason.IDLE), None)
    if idle is not None:  # stopped for idle GPUs: the job ends (a retry would hold them idle again)
        return JobFailed(
            job_id=job_id,
            attempt=attempt,
            reason=FailureReason.IDLE,
            message=idle.message,
            signal=idle.signal,
            replica=idle.replica,
            log_tail=view.log_tail,
        )
    built = next((e for e in failed if e.reason == FailureReason.ENVIRONMENT_FAILED), None)
    if built is not None:  # its environment could not be built: the job ends (a retry would build it again)
        return JobFailed(
            job_id=job_id,
            attempt=attempt,
            reason=FailureReason.ENVIRONMENT_FAILED,
            message=f"replica {built.replica}: {built.message}",
            replica=built.replica,
            log_tail=view.log_tail,
        )
    if failed and failed[0].reason == FailureReason.NODE_LOST:
        # how it ended could not be known (its reaper, pod or node gone): not the job's failure, so a new
        # attempt, as for a lost node, that no retry is spent on
        lost = failed[0]
        return JobRequeued(
            job_id=job_id,
            attempt=attempt + 1,
            reason=RequeueReason.NODE_LOST,
            message=f"replica {lost.replica}: {lost.message}",
        )
    if failed:
        first = failed[0]
        if attempt <= view.spec.max_retries:
            backoff = retry_backoff * 2 ** (attempt - 1)
            return JobRequeued(
                job_id=job_id,
                attempt=attempt + 1,
                reason=RequeueReason.RETRY,
                message=f"retry {attempt}/{view.spec.max_retries} after: {first.message}",
                not_before=datetime.now(UTC) + timedelta(seconds=backoff),
                exit_code=first.exit_code,
            )
        return JobFailed(
            job_id=job_id,
            attempt=attempt,
            reason=first.reason,
            message=f"replica {first.replica}: {first.message}",
            exit_code=first.exit_code,
            signal=first.signal,
            replica=first.replica,
            log_tail=view.log_tail,
        )
    if len({e.replica for e in view.exits}) == view.spec.replicas and view.state == JobState.RUNNING:
        return JobSucceeded(job_id=job_id, attempt=attempt)
    return None


def preempted_requeue(view: JobView, attempt: int) -> JobRequeued:
    """The requeue that ends a preempted attempt: its message the preemption in words."""
    why = view.preempt_requested.text if view.preempt_requested else StopReason.PREEMPTED.value
    return JobRequeued(job_id=view.job_id, attempt=attempt + 1, reason=RequeueReason.PREEMPTED, message=why)
