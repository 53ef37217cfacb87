"""The Kubernetes controller against `FakeKubeApi`, an in-memory API.

The fake's limits (see its module): no scheduler, kubelet or garbage collector: pods stay Pending until the
test sets their status (phase, container states, node); no admission webhooks, defaulting or validation (the
manifest tests validate the schema); label selectors are `key=value` only; one namespace.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.services.executor.kubernetes.api import KubeApiError, KubeNotFound
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.controller import KubernetesController
from gpuyard.services.executor.kubernetes.outcomes import ReplicaPhase
from gpuyard.shared.contracts.events.jobs import FailureReason, GpuShare, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from tests.unit.services.executor.fake_kube_api import FakeKubeApi


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def api(clock):
    return FakeKubeApi(namespace="jobs", clock=clock)


@pytest.fixture
def controller(api, clock):
    return KubernetesController(
        api, KubernetesConfig(namespace="jobs", start_timeout_seconds=300), clock=clock
    )


async def launch(controller, job_id="j1", attempt=1, replicas=1, **spec):
    job = JobSpec.model_validate({"command": "python train.py", "replicas": replicas, **spec})
    placements = [
        ReplicaPlacement(replica=r, node=f"node-{r}", gpus=[GpuShare(index=0)], cpus=2, memory_bytes=2**30)
        for r in range(replicas)
    ]
    return await controller.launch(
        job_id=job_id, attempt=attempt, job_name="train", tenant="team", spec=job, placements=placements
    )


def pod_names(api, replica=None):
    return sorted(
        name
        for name, pod in api.pods.items()
        if replica is None or pod["metadata"]["labels"]["gpuyard.io/replica"] == str(replica)
    )


def finished(exit_code, reason="Error", **pod_status):
    state = {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": "2025-05-01T12:00:01Z"}}
    phase = "Succeeded" if exit_code == 0 else "Failed"
    return {"phase": phase, "containerStatuses": [{"name": "worker", "state": state}], **pod_status}


async def test_launch_creates_pods_and_service_with_replica_zero_as_owner(controller, api):
    result = await launch(controller, replicas=3)
    assert len(api.pods) == 3 and len(api.services) == 1
    assert sorted(result.created) == sorted([*api.pods, *api.services]) and not result.existing
    first = api.pods[pod_names(api, 0)[0]]
    assert "ownerReferences" not in first["metadata"]
    owned = [*(api.pods[n] for n in pod_names(api) if n != first["metadata"]["name"]), *api.services.values()]
    for obj in owned:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Pod",
            first["metadata"]["name"],
            first["metadata"]["uid"],
        )
    assert [call for call in api.calls if call[0] == "create_pod"][0][1] == first["metadata"]["name"]


async def test_redelivered_placement_creates_nothing_new(controller, api):
    await launch(controller, replicas=2)
    before = {name: pod["metadata"]["uid"] for name, pod in api.pods.items()}
    again = await launch(controller, replicas=2)
    assert again.created == [] and len(again.existing) == 3
    assert {name: pod["metadata"]["uid"] for name, pod in api.pods.items()} == before


async def test_launch_interrupted_halfway_is_completed_by_the_redelivery(controller, api):
    job = await launch(controller, job_id="probe", replicas=3)  # learn the names
    names = sorted(job.created)
    api.pods.clear()
    api.services.clear()
    last_pod = [n for n in names if n.endswith("-r2")][0]
    api.fail_once[last_pod] = KubeApiError(500, "etcd timeout")
    with pytest.raises(KubeApiError):
        await launch(controller, job_id="probe", replicas=3)
    assert len(api.pods) == 2
    result = await launch(controller, job_id="probe", replicas=3)
    assert result.created == [last_pod] and len(api.pods) == 3
    uid0 = api.pods[pod_names(api, 0)[0]]["metadata"]["uid"]
    assert api.pods[last_pod]["metadata"]["ownerReferences"][0]["uid"] == uid0


async def test_cancel_deletes_the_attempt_only_and_blocks_relaunch(controller, api):
    await launch(controller, job_id="j1", replicas=2)
    await launch(controller, job_id="j1", attempt=2, replicas=2)
    await launch(controller, job_id="j2")
    assert await controller.cancel("j1", 1) == 2
    remaining = {
        (p["metadata"]["labels"]["gpuyard.io/job-id"], p["metadata"]["labels"]["gpuyard.io/attempt"])
        for p in api.pods.values()
    }
    assert remaining == {("j1", "2"), ("j2", "1")}
    assert len(api.services) == 1
    assert (await launch(controller, job_id="j1", replicas=2)).skipped
    assert len(api.pods) == 3


async def test_poll_reports_each_change_once(controller, api):
    await launch(controller)
    (name,) = pod_names(api)
    assert await controller.poll() == []  # pending: nothing to say
    api.set_status(name, phase="Running", node="node-0")
    (started,) = await controller.poll()
    assert (started.phase, started.node, started.job_id, started.attempt, started.replica) == (
        ReplicaPhase.RUNNING,
        "node-0",
        "j1",
        1,
        0,
    )
    assert await controller.poll() == []
    api.set_status(name, node="node-0", **finished(0, reason="Completed"))
    (done,) = await controller.poll()
    assert (done.phase, done.exit_code, done.reason) == (ReplicaPhase.SUCCEEDED, 0, None)
    assert await controller.poll() == []


async def test_fast_replica_is_reported_started_before_it_exits(controller, api):
    await launch(controller)
    api.set_status(pod_names(api)[0], **finished(0))
    outcomes = await controller.poll()
    assert [o.phase for o in outcomes] == [ReplicaPhase.RUNNING, ReplicaPhase.SUCCEEDED]


async def test_failed_replica_carries_log_tail(controller, api):
    await launch(controller)
    (name,) = pod_names(api)
    api.set_status(name, phase="Running")
    await controller.poll()
    api.logs[name] = "\n".join(f"line {i}" for i in range(100))
    api.set_status(name, **finished(2))
    (failed,) = await controller.poll()
    assert (failed.reason, failed.exit_code) == (FailureReason.EXIT_CODE, 2)
    assert len(failed.log_tail) == 50 and failed.log_tail[-1] == "line 99"


async def test_cuda_oom_is_recognised_from_the_log(controller, api):
    await launch(controller)
    (name,) = pod_names(api)
    api.logs[name] = "epoch 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\n"
    api.set_status(name, **finished(1))
    outcomes = await controller.poll()
    assert outcomes[-1].reason is FailureReason.CUDA_OOM
    assert outcomes[-1].exit_code == 1
    assert "Tried to allocate" in outcomes[-1].log_tail[-1]


async def test_oom_killed_is_not_reclassified_by_the_log(controller, api):
    await launch(controller)
    (name,) = pod_names(api)
    api.logs[name] = "CUDA out of memory"
    api.set_status(name, **finished(137, reason="OOMKilled"))
    assert (await controller.poll())[-1].reason is FailureReason.OOM_KILLED


async def test_missing_log_does_not_break_poll(controller, api):
    await launch(controller)
    api.set_status(pod_names(api)[0], **finished(1))
    outcomes = await controller.poll()
    assert outcomes[-1].reason is FailureReason.EXIT_CODE and outcomes[-1].log_tail == ()


async def test_timeout_and_eviction(controller, api):
    await launch(controller, job_id="slow", timeout="1h")
    await launch(controller, job_id="evicted")
    for name, pod in api.pods.items():
        if pod["metadata"]["annotations"]["gpuyard.io/job-id"] == "slow":
            api.set_status(name, phase="Failed", reason="DeadlineExceeded", message="deadline")
        else:
            api.set_status(name, phase="Failed", reason="Evicted", message="node low on memory")
    reasons = {o.job_id: o.reason for o in await controller.poll()}
    assert reasons == {"slow": FailureReason.TIMEOUT, "evicted": FailureReason.NODE_LOST}


async def test_unschedulable_pod_fails_to_start_after_the_timeout(controller, api, clock):
    await launch(controller)
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}
    api.set_status(pod_names(api)[0], phase="Pending", conditions=[condition])
    assert await controller.poll() == []
    clock.advance(301)
    (failed,) = await controller.poll()
    assert (failed.phase, failed.reason) == (ReplicaPhase.FAILED, FailureReason.START_FAILED)
    assert "0/2 nodes" in failed.message
    assert ("read_pod_log", failed.pod) not in api.calls


async def test_image_pull_error_fails_to_start(controller, api, clock):
    await launch(controller)
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}
    api.set_status(
        pod_names(api)[0], phase="Pending", containerStatuses=[{"name": "worker", "state": waiting}]
    )
    assert await controller.poll() == []
    clock.advance(600)
    (failed,) = await controller.poll()
    assert failed.reason is FailureReason.START_FAILED and "pull access denied" in failed.message


async def test_pod_deleted_behind_our_back_is_node_lost(controller, api):
    await launch(controller)
    (name,) = pod_names(api)
    api.set_status(name, phase="Running", node="node-0")
    await controller.poll()
    api.remove_pod(name)
    (lost,) = await controller.poll()
    assert (lost.phase, lost.reason, lost.node, lost.replica) == (
        ReplicaPhase.FAILED,
        FailureReason.NODE_LOST,
        "node-0",
        0,
    )
    assert await controller.poll() == []


async def test_cancelled_and_cleaned_up_attempts_report_nothing(controller, api):
    await launch(controller, job_id="a")
    await launch(controller, job_id="b")
    for name in pod_names(api):
        api.set_status(name, phase="Running")
    assert len(await controller.poll()) == 2
    await controller.cancel("a", 1)
    assert await controller.poll() == []
    api.set_status(pod_names(api)[0], **finished(0))
    await controller.poll()
    await controller.cancel("b", 1)  # clean-up of a finished attempt
    assert await controller.poll() == []


async def test_a_restarted_controller_reports_current_state_again(api, clock):
    first = KubernetesController(api, KubernetesConfig(namespace="jobs"), clock=clock)
    await launch(first, replicas=2)
    running, done = pod_names(api)
    api.set_status(running, phase="Running")
    api.set_status(done, **finished(0))
    before = await first.poll()
    second = KubernetesController(api, KubernetesConfig(namespace="jobs"), clock=clock)
    assert await second.poll() == before


async def test_foreign_pods_are_ignored(controller, api):
    api.pods["other"] = {
        "metadata": {"name": "other", "labels": {"app.kubernetes.io/managed-by": "gpuyard"}},
        "status": {"phase": "Running"},
    }
    assert await controller.poll() == []


async def test_logs_of_a_replica(controller, api):
    await launch(controller, replicas=2)
    name = pod_names(api, 1)[0]
    api.logs[name] = "a\nb\nc"
    assert await controller.logs("j1", 1, 1, tail_lines=2) == ["b", "c"]
    assert await controller.logs("j1", 1, 1) == ["a", "b", "c"]
    with pytest.raises(KubeNotFound):
        await controller.logs("j1", 1, 5)
