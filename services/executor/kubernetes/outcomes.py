"""What a pod's status means for its replica: a pure mapping from a pod (API-shaped dict) to an outcome.

Pending   → PENDING, unless it can no longer start: a configuration error at once, an image it cannot pull
            or no node that takes it for longer than `start_timeout` → FAILED / START_FAILED.
Running   → RUNNING.
Succeeded → SUCCEEDED, exit code 0.
Failed    → FAILED with, in this order: DeadlineExceeded → TIMEOUT; evicted, node shut down or lost, deleted by
            the taint manager → NODE_LOST; rejected by the kubelet (OutOfcpu…) → START_FAILED; OOMKilled →
            OOM_KILLED; the command could not be executed → COMMAND_NOT_FOUND / START_FAILED; exit 128+N →
            SIGNAL N; other non-zero → EXIT_CODE. (CUDA_OOM needs the log: the controller adds it.)
An init container (the copy of the job's volumes from the object store, `volumecopy.py`) that fails, or whose
image cannot be pulled, fails the replica to start, with its own last log line (its reason).
"""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from gpuyard.services.executor.exits import replica_exit
from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.manifests import CONTAINER
from gpuyard.shared.contracts.events.jobs import FailureReason, JobReplicaExited


class ReplicaPhase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (ReplicaPhase.SUCCEEDED, ReplicaPhase.FAILED)


@dataclass(frozen=True)
class ReplicaOutcome:
    job_id: str
    attempt: int
    replica: int
    node: str
    phase: ReplicaPhase
    exit_code: int | None = None
    signal: int | None = None
    reason: FailureReason | None = None
    """None unless phase is FAILED."""
    message: str = ""
    log_tail: tuple[str, ...] = ()
    pod: str = ""
    container_started: bool = False
    """Whether the job's process ran at all (a FAILED replica may have failed before it started)."""

    def with_(self, **changes: Any) -> ReplicaOutcome:
        return replace(self, **changes)

    def exit(self, node: str) -> JobReplicaExited:
        """A finished replica's end, as the executor records it (`node`: the GPUYARD node it was placed on)."""
        return replica_exit(
            self.job_id,
            self.attempt,
            self.replica,
            node,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=self.reason,
            message=self.message,
            log_tail=self.log_tail,
        )


IMMEDIATE_START_FAILURES = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "InvalidImageName", "ErrImageNeverPull"}
)
SLOW_START_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff"})
NODE_LOSS_REASONS = frozenset({"Evicted", "NodeLost", "Terminated", "Shutdown", "NodeShutdown"})
NODE_LOSS_DISRUPTIONS = frozenset(
    {"DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet", "EvictionByEvictionAPI"}
)
KUBELET_REJECTIONS = frozenset({"NodeAffinity", "UnexpectedAdmissionError", "NodeAffinityMismatch"})


def parse_time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


def pod_identity(pod: dict[str, Any]) -> tuple[str, int, int] | None:
    """(job_id, attempt, replica) of a GPUYARD pod, None for any other pod."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    job_id = annotations.get(job_labels.JOB_ID_EXACT) or labels.get(job_labels.JOB_ID)
    if not job_id:
        return None
    try:
        return job_id, int(labels[job_labels.ATTEMPT]), int(labels[job_labels.REPLICA])
    except (KeyError, TypeError, ValueError):
        return None


def pod_outcome(pod: dict[str, Any], *, now: datetime, start_timeout: float) -> ReplicaOutcome | None:
    identity = pod_identity(pod)
    if identity is None:
        return None
    job_id, attempt, replica = identity
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    base = ReplicaOutcome(
        job_id=job_id,
        attempt=attempt,
        replica=replica,
        node=spec.get("nodeName") or (meta.get("annotations") or {}).get(job_labels.NODE, ""),
        phase=ReplicaPhase.PENDING,
        pod=meta.get("name", ""),
    )
    phase = status.get("phase") or "Pending"
    container = _container_status(status)
    if phase == "Pending":
        created = parse_time(meta.get("creationTimestamp"))
        age = (now - created).total_seconds() if created else 0.0
        return _pending(base, status, container, age, start_timeout)
    if phase == "Running":
        return base.with_(phase=ReplicaPhase.RUNNING, container_started=True)
    if phase == "Succeeded":
        return base.with_(phase=ReplicaPhase.SUCCEEDED, exit_code=0, container_started=True)
    if phase == "Failed":
        return _failed(base, status, container)
    return base.with_(phase=ReplicaPhase.RUNNING)  # "Unknown": the node stopped reporting; wait and see


def _container_status(status: dict[str, Any]) -> dict[str, Any]:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == CONTAINER:
            return container
    return {}


def _init_failure(status: dict[str, Any]) -> str | None:
    """What ended the pod's init container that failed (its name and last log line), None when none did."""
    for init in status.get("initContainerStatuses") or []:
        terminated = (init.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode") != 0:
            detail = (terminated.get("message") or "").strip()
            summary = f"init container {init.get('name', '')} failed (exit code {terminated.get('exitCode')})"
            return _with_detail(summary, detail)
    return None


def _pending(
    base: ReplicaOutcome,
    status: dict[str, Any],
    container: dict[str, Any],
    age: float,
    start_timeout: float,
) -> ReplicaOutcome:
    for candidate in [*(status.get("initContainerStatuses") or []), container]:
        waiting = (candidate.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in IMMEDIATE_START_FAILURES or (reason in SLOW_START_FAILURES and age >= start_timeout):
            return _start_failed(base, f"{reason}: {waiting.get('message', '')}".rstrip(": "))
    unschedulable = _condition(status, "PodScheduled")
    if (
        unschedulable.get("status") == "False"
        and unschedulable.get("reason") == "Unschedulable"
        and age >= start_timeout
    ):
        message = unschedulable.get("message", "no node accepts the pod")
        return _start_failed(base, f"unschedulable for {age:.0f}s: {message}")
    return base


def _failed(base: ReplicaOutcome, status: dict[str, Any], container: dict[str, Any]) -> ReplicaOutcome:
    terminated = (container.get("state") or {}).get("terminated") or {}
    exit_code = terminated.get("exitCode")
    signal = exit_code - 128 if isinstance(exit_code, int) and 128 < exit_code <= 128 + 64 else None
    failed = base.with_(
        phase=ReplicaPhase.FAILED,
        exit_code=exit_code,
        signal=signal,
        container_started=bool(terminated.get("startedAt")),
    )
    pod_reason, pod_message = status.get("reason", ""), status.get("message", "")
    disruption = _condition(status, "DisruptionTarget")
    if pod_reason == "DeadlineExceeded":
        return failed.with_(reason=FailureReason.TIMEOUT, message=pod_message or "active deadline exceeded")
    if pod_reason in NODE_LOSS_REASONS or (
        disruption.get("status") == "True" and disruption.get("reason") in NODE_LOSS_DISRUPTIONS
    ):
        message = pod_message or disruption.get("message") or pod_reason or "the pod's node went away"
        return failed.with_(reason=FailureReason.NODE_LOST, message=message)
    if pod_reason in KUBELET_REJECTIONS or pod_reason.startswith("OutOf"):
        return _start_failed(failed, f"{pod_reason}: {pod_message}".rstrip(": "))
    if not terminated:
        init = _init_failure(status)
        return _start_failed(failed, init or pod_message or pod_reason or "the container never ran")
    return failed.with_(**_termination(terminated, exit_code, signal))


def _termination(terminated: dict[str, Any], exit_code: int | None, signal: int | None) -> dict[str, Any]:
    reason, detail = terminated.get("reason", ""), (terminated.get("message") or "").strip()
    if reason == "OOMKilled":
        return {
            "reason": FailureReason.OOM_KILLED,
            "message": "killed: the container exceeded its memory limit",
        }
    if reason in ("StartError", "ContainerCannotRun"):
        lowered = detail.lower()
        not_found = "not found" in lowered or "no such file" in lowered
        code = FailureReason.COMMAND_NOT_FOUND if not_found else FailureReason.START_FAILED
        return {"reason": code, "message": detail or reason, "container_started": False}
    if exit_code == 127:
        return {"reason": FailureReason.COMMAND_NOT_FOUND, "message": _with_detail("exit code 127", detail)}
    if signal is not None:
        return {
            "reason": FailureReason.SIGNAL,
            "message": _with_detail(f"killed by {_signal_name(signal)}", detail),
        }
    return {"reason": FailureReason.EXIT_CODE, "message": _with_detail(f"exit code {exit_code}", detail)}


def _start_failed(outcome: ReplicaOutcome, message: str) -> ReplicaOutcome:
    return outcome.with_(phase=ReplicaPhase.FAILED, reason=FailureReason.START_FAILED, message=message)


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _with_detail(summary: str, detail: str) -> str:
    # FallbackToLogsOnError puts the log's end in `message`; keep the summary short, the log travels separately.
    last = detail.splitlines()[-1] if detail else ""
    return f"{summary}: {last}" if last else summary
