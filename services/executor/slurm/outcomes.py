"""What a batch job's Slurm state means for its replica: a pure mapping to the same causes as the other backends.

COMPLETED     → exit 0.
FAILED        → the batch script's wait status: a signal → SIGNAL N; exit 127 / 126 → COMMAND_NOT_FOUND /
                START_FAILED; any other code → EXIT_CODE.
CANCELLED     → SIGNAL (the signal, else SIGTERM): someone cancelled it in Slurm (GPUYARD's own stops are reported
                by the backend's `stop` before Slurm says so).
TIMEOUT       → TIMEOUT (Slurm's `--time`, the backstop of GPUYARD's own timeout); DEADLINE likewise.
OUT_OF_MEMORY → OOM_KILLED (where Slurm's cgroup task plugin enforces memory). Where memory is enforced by polling
                instead (`JobAcctGatherParams=OverMemoryKill`), Slurm says FAILED, SIGKILL: slurmstepd's line in
                the job's output (`OVER_MEMORY`) makes it OOM_KILLED (`over_memory`).
NODE_FAIL     → NODE_LOST: the scheduler requeues the attempt, as for a lost node on any backend.
PREEMPTED     → NODE_LOST too: Slurm's own preemption took the node from the job, not the job's fault.
BOOT_FAIL     → START_FAILED.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Sequence

from gpuyard.services.executor.slurm.queue import SlurmJob
from gpuyard.shared.contracts.events.jobs import FailureReason

Outcome = tuple[int | None, int | None, FailureReason | None, str]
"""(exit code, signal, reason, message)."""
FINISHED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)


OVER_MEMORY = "Exceeded job memory limit"
"""What slurmstepd writes into a batch job's output when it kills the job for its memory (OverMemoryKill)."""


def finished(job: SlurmJob) -> bool:
    return job.state in FINISHED


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _from_status(job: SlurmJob) -> Outcome:
    signal, code = job.status & 0x7F, (job.status >> 8) & 0xFF
    if signal:
        return (
            None,
            signal,
            FailureReason.SIGNAL,
            f"killed by {_signal_name(signal)} (Slurm job {job.slurm_id})",
        )
    if code == 0:
        return 0, None, None, ""
    if code == 127:
        return code, None, FailureReason.COMMAND_NOT_FOUND, "command not found (exit 127)"
    if code == 126:
        return code, None, FailureReason.START_FAILED, "command not executable (exit 126)"
    return code, None, FailureReason.EXIT_CODE, f"exited with code {code}"


def outcome(job: SlurmJob) -> Outcome:
    """How a finished batch job ended, for its replica."""
    state, where = job.state, f"Slurm job {job.slurm_id}"
    if state == "COMPLETED":
        return _from_status(job)
    if state == "FAILED":
        exit_code, signal, reason, message = _from_status(job)
        return (
            exit_code,
            signal,
            reason or FailureReason.EXIT_CODE,
            message or f"{where} failed ({job.reason})",
        )
    if state == "CANCELLED":
        signal = job.status & 0x7F or int(signals.SIGTERM)
        return None, signal, FailureReason.SIGNAL, f"{where} was cancelled in Slurm ({_signal_name(signal)})"
    if state in ("TIMEOUT", "DEADLINE"):
        return None, None, FailureReason.TIMEOUT, f"{where} reached its Slurm time limit ({state})"
    if state == "OUT_OF_MEMORY":
        return None, None, FailureReason.OOM_KILLED, f"{where} ran out of memory (Slurm: OUT_OF_MEMORY)"
    if state in ("NODE_FAIL", "PREEMPTED"):
        said = "its node failed" if state == "NODE_FAIL" else "Slurm preempted it"
        return None, None, FailureReason.NODE_LOST, f"{where}: {said} ({state}, node {job.nodes or '?'})"
    return None, None, FailureReason.START_FAILED, f"{where} ended as {state} ({job.reason})"


def over_memory(ended: Outcome, tail: Sequence[str], job: SlurmJob) -> Outcome:
    """A SIGKILL that slurmstepd's line at the end of the job's output says was for its memory: OOM_KILLED."""
    if ended[1] != signals.SIGKILL or not any(OVER_MEMORY in line for line in tail):
        return ended
    return (
        None,
        ended[1],
        FailureReason.OOM_KILLED,
        f"Slurm job {job.slurm_id} exceeded its memory limit (--mem)",
    )
