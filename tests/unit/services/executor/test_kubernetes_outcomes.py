"""Pod status → replica outcome, one case per rule, on API-shaped pods as `kubectl get -o json` shows them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.services.executor.classify import classify_log_tail
from gpuyard.services.executor.kubernetes.outcomes import ReplicaPhase, pod_outcome
from gpuyard.shared.contracts.events.jobs import FailureReason

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def pod(status: dict, *, age_s: float = 10, node: str | None = "gpu-1") -> dict:
    return {
        "metadata": {
            "name": "gy-train-abc-a1-r3",
            "creationTimestamp": (NOW - timedelta(seconds=age_s)).isoformat().replace("+00:00", "Z"),
            "labels": {"gpuyard.io/job-id": "j1", "gpuyard.io/attempt": "1", "gpuyard.io/replica": "3"},
            "annotations": {"gpuyard.io/job-id": "j1", "gpuyard.io/node": "planned-node"},
        },
        "spec": {"nodeName": node} if node else {},
        "status": status,
    }


def waiting(reason: str, message: str = "") -> dict:
    return {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "worker", "state": {"waiting": {"reason": reason, "message": message}}}
        ],
    }


def terminated(exit_code: int, reason: str = "Error", message: str = "", **status) -> dict:
    state = {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "message": message,
            "startedAt": "2025-05-01T11:59:00Z",
        }
    }
    return {
        "phase": "Failed" if exit_code else "Succeeded",
        "containerStatuses": [{"name": "worker", "state": state}],
        **status,
    }


def outcome(status: dict, **kwargs):
    return pod_outcome(pod(status, **kwargs), now=NOW, start_timeout=300)


def test_identity_and_node():
    result = outcome({"phase": "Running"})
    assert (result.job_id, result.attempt, result.replica, result.node) == ("j1", 1, 3, "gpu-1")
    assert result.phase is ReplicaPhase.RUNNING and result.container_started
    assert outcome({"phase": "Pending"}, node=None).node == "planned-node"


def test_foreign_pods_are_ignored():
    assert pod_outcome({"metadata": {"name": "x", "labels": {}}}, now=NOW, start_timeout=1) is None


def test_pending_stays_pending():
    assert outcome({"phase": "Pending"}).phase is ReplicaPhase.PENDING
    assert outcome(waiting("ContainerCreating")).phase is ReplicaPhase.PENDING


def test_succeeded_is_exit_zero():
    result = outcome(terminated(0, reason="Completed"))
    assert (result.phase, result.exit_code, result.reason) == (ReplicaPhase.SUCCEEDED, 0, None)


def test_non_zero_exit():
    result = outcome(terminated(3, message="Traceback...\nValueError: bad lr"))
    assert (result.phase, result.exit_code, result.signal) == (ReplicaPhase.FAILED, 3, None)
    assert result.reason is FailureReason.EXIT_CODE
    assert result.message == "exit code 3: ValueError: bad lr"


def test_signal_from_128_plus_n():
    result = outcome(terminated(143))
    assert (result.reason, result.signal, result.exit_code) == (FailureReason.SIGNAL, 15, 143)
    assert "SIGTERM" in result.message


def test_oom_killed():
    result = outcome(terminated(137, reason="OOMKilled"))
    assert (result.reason, result.signal) == (FailureReason.OOM_KILLED, 9)


def test_deadline_exceeded_is_timeout():
    status = terminated(137)
    status.update(
        reason="DeadlineExceeded", message="Pod was active on the node longer than the specified deadline"
    )
    result = outcome(status)
    assert result.reason is FailureReason.TIMEOUT
    assert "deadline" in result.message


@pytest.mark.parametrize("reason", ["Evicted", "NodeLost", "Terminated"])
def test_evicted_or_node_gone_is_node_lost(reason):
    result = outcome(
        {"phase": "Failed", "reason": reason, "message": "The node was low on resource: memory."}
    )
    assert result.reason is FailureReason.NODE_LOST
    assert result.message == "The node was low on resource: memory."
    assert not result.container_started


def test_taint_manager_deletion_is_node_lost():
    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint",
    }
    result = outcome({**terminated(143), "conditions": [condition]})
    assert result.reason is FailureReason.NODE_LOST
    assert "NoExecute" in result.message


def test_kubelet_admission_rejection_is_start_failed():
    result = outcome(
        {"phase": "Failed", "reason": "OutOfnvidia.com/gpu", "message": "Node didn't have enough resource"}
    )
    assert result.reason is FailureReason.START_FAILED
    assert result.message.startswith("OutOfnvidia.com/gpu")


@pytest.mark.parametrize("reason", ["CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"])
def test_configuration_errors_fail_at_once(reason):
    result = outcome(waiting(reason, 'secret "x" not found'), age_s=1)
    assert (result.phase, result.reason) == (ReplicaPhase.FAILED, FailureReason.START_FAILED)
    assert result.message == f'{reason}: secret "x" not found'
    assert not result.container_started


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
def test_image_pull_errors_fail_after_the_start_timeout(reason):
    assert outcome(waiting(reason, "manifest unknown"), age_s=299).phase is ReplicaPhase.PENDING
    result = outcome(waiting(reason, "manifest unknown"), age_s=301)
    assert (result.reason, result.message) == (FailureReason.START_FAILED, f"{reason}: manifest unknown")


def test_unschedulable_fails_after_the_start_timeout():
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    status = {"phase": "Pending", "conditions": [condition]}
    assert outcome(status, age_s=100, node=None).phase is ReplicaPhase.PENDING
    result = outcome(status, age_s=400, node=None)
    assert result.reason is FailureReason.START_FAILED
    assert result.message == "unschedulable for 400s: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def test_command_not_found():
    result = outcome(
        terminated(128, reason="StartError", message='exec: "trian.py": executable file not found in $PATH')
    )
    assert result.reason is FailureReason.COMMAND_NOT_FOUND
    assert not result.container_started
    assert (
        outcome(terminated(127, message="sh: 1: trian: not found")).reason is FailureReason.COMMAND_NOT_FOUND
    )
    other = outcome(terminated(128, reason="StartError", message="permission denied"))
    assert other.reason is FailureReason.START_FAILED


def test_failed_without_container_status_is_start_failed():
    result = outcome({"phase": "Failed", "message": "Pod was rejected"})
    assert (result.reason, result.message) == (FailureReason.START_FAILED, "Pod was rejected")


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            ["step 10", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
            FailureReason.CUDA_OOM,
        ),
        (["RuntimeError: CUDA error: out of memory"], FailureReason.CUDA_OOM),
        (["cuda_error_out_of_memory"], FailureReason.CUDA_OOM),
        (["MemoryError", "Killed"], None),
        ([], None),
    ],
)
def test_log_classifier(lines, expected):
    assert classify_log_tail(lines) is expected
