"""The executor's lifecycle with the Kubernetes backend, end to end through `Executor`, against the in-memory
`FakeKubeApi` (no API server here: pods change phase only when the test sets their status)."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.services.executor.kubernetes.api import KubeApiError
from gpuyard.services.executor.kubernetes.backend import KubernetesBackend
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.controller import KubernetesController
from gpuyard.services.executor.kubernetes.names import attempt_names
from gpuyard.shared.contracts.events.jobs import GpuShare, JobCancelRequested, JobSucceeded
from gpuyard.shared.runtime.paths import log_path
from gpuyard.shared.stores.logs import LogKey
from gpuyard.shared.stores.logs.reading import read_range
from gpuyard.shared.stores.logs.shipper import LogShipper
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry


def backend_for(api, h, **config) -> KubernetesBackend:
    controller = KubernetesController(api, KubernetesConfig(namespace="jobs", log_tail_lines=5, **config))
    # poll_interval: only the first poll runs by itself; the tests poll when they have changed something
    shipper = LogShipper(h.logs, interval=3600)  # flushed by the tests
    return KubernetesBackend(
        controller,
        data_dir=h.data_dir,
        poll_interval=3600,
        log_interval=0,
        shipper=shipper,
        volumes=VolumeRegistry(h.store, None, "/test").get,
    )


def node_log(h, job: str, replica: int) -> str:
    return log_path(h.data_dir, job, 1, replica).read_text()


async def shipped(h, job: str, replica: int) -> bytes:
    return b"".join([piece async for piece in read_range(h.logs, LogKey(job, 1, replica))])


async def k8s_executor(h, api, config=None, **settings):
    backend = backend_for(api, h, **(config or {}))
    return await h.executor(backend=backend, executor_backend="kubernetes", **settings)


def pod(api, replica=0) -> str:
    (name,) = [
        n for n, p in api.pods.items() if p["metadata"]["labels"]["gpuyard.io/replica"] == str(replica)
    ]
    return name


def terminated(exit_code, reason="Error"):
    state = {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": "2025-05-01T12:00:01Z"}}
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [{"name": "worker", "state": state}],
    }


async def test_a_two_pod_job_runs_succeeds_and_its_logs_land_in_the_data_dir_and_the_log_store(h, api):
    ex = await k8s_executor(h, api)
    job = await h.submit(command="python train.py", replicas=2, resources={"gpus": 1})
    # one executor runs every node's replicas: placements name the cluster's nodes, not the executor's
    await h.place(ex, job, nodes=["gpu-1", "gpu-2"], gpus=[[GpuShare(index=0)], [GpuShare(index=0)]])
    assert len(api.pods) == 2 and len(api.services) == 1
    assert (await h.view(job)).state == "placed"  # pods exist, none is running yet
    for r in (0, 1):
        api.set_status(pod(api, r), phase="Running", node=f"gpu-{r + 1}")
    api.logs[pod(api, 0)] = "epoch 1\n"
    await ex.backend.poll_once()
    await h.wait(job, "running")
    assert "epoch 1" in node_log(h, job, 0)
    api.logs[pod(api, 0)] = "epoch 1\nepoch 2\ndone\n"
    api.logs[pod(api, 1)] = "worker done\n"
    for r in (0, 1):
        api.set_status(pod(api, r), **terminated(0, "Completed"))
    await ex.backend.poll_once()
    view = await h.wait(job, "succeeded")
    started = [e.data for e in await h.ledger.events(job) if e.type.endswith("started")]
    assert sorted((s.node, s.replicas) for s in started) == [("gpu-1", [0]), ("gpu-2", [1])]
    assert node_log(h, job, 0) == "epoch 1\nepoch 2\ndone\n"  # each line copied once
    assert node_log(h, job, 1) == "worker done\n"
    await ex.backend.shipper.flush()
    assert (
        await shipped(h, job, 0) == b"epoch 1\nepoch 2\ndone\n"
        and await shipped(h, job, 1) == b"worker done\n"
    )
    assert view.exit_code == 0
    await h.deliver(ex, JobSucceeded(job_id=job, attempt=1))  # the attempt is over: its pods go
    assert not api.pods and not api.services


@pytest.mark.parametrize(
    ("status", "reason", "words"),
    [
        (terminated(3), "exit_code", "exit code 3"),
        (terminated(137, "OOMKilled"), "oom_killed", "exceeded its memory limit"),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "worker",
                        "state": {
                            "waiting": {"reason": "CreateContainerConfigError", "message": "no secret"}
                        },
                    }
                ],
            },
            "start_failed",
            "CreateContainerConfigError: no secret",
        ),
        ({"phase": "Failed", "reason": "DeadlineExceeded", "message": "deadline"}, "timeout", "deadline"),
    ],
)
async def test_a_pods_end_becomes_the_jobs_failure_with_its_cause(h, api, status, reason, words):
    ex = await k8s_executor(h, api)
    job = await h.submit(command="python train.py")
    await h.place(ex, job)
    api.logs[pod(api)] = "loading\nTraceback: boom\n"
    api.set_status(pod(api), **status)
    await ex.backend.poll_once()
    view = await h.wait(job, "failed")
    assert view.failure_reason == reason and words in view.message
    if reason == "exit_code":
        assert view.exit_code == 3 and "Traceback: boom" in view.log_tail


async def test_cancel_deletes_the_pods_and_the_job_is_cancelled(h, api):
    ex = await k8s_executor(h, api)
    job = await h.submit(command="sleep 1000", replicas=2)
    await h.place(ex, job)
    for r in (0, 1):
        api.set_status(pod(api, r), phase="Running")
    await ex.backend.poll_once()
    await h.wait(job, "running")
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    view = await h.wait(job, "cancelled")
    assert view.message == "cancelled while running" and not api.pods
    deleted = [c for c in api.calls if c[0] == "delete_pods"]
    assert deleted and "gpuyard.io/attempt=1" in deleted[0][1]


async def test_the_executors_timeout_deletes_the_pods_and_fails_with_timeout(h, api):
    ex = await k8s_executor(h, api)
    job = await h.submit(command="sleep 1000", timeout=0.3)
    await h.place(ex, job)
    api.set_status(pod(api), phase="Running")
    await ex.backend.poll_once()
    view = await h.wait(job, "failed")
    assert view.failure_reason == "timeout" and "timed out after 0.3s" in view.message
    assert not api.pods


async def test_a_refused_pod_fails_the_job_to_start_with_the_api_servers_words(h, api):
    ex = await k8s_executor(h, api)
    job = await h.submit(command="python train.py")
    first_pod = attempt_names("gy", "unit", job, 1).pod(0)
    api.fail_once[first_pod] = KubeApiError(403, "pods is forbidden: exceeded quota")
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed"
    assert view.message == "replica 0: Kubernetes refused the job's pods: pods is forbidden: exceeded quota"
    assert "started" not in await h.types(job)


async def test_a_job_whose_volume_is_gone_fails_to_start_with_the_reason_and_no_pod_runs(h, api):
    ex = await k8s_executor(h, api)
    job = await h.submit(command="python train.py", volumes=[{"name": "imagenet", "path": "/data"}])
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and view.message == "replica 0: volume imagenet was deleted"
    assert not api.pods and not api.services and not api.claims


async def running_pod_left_by_a_stopped_executor(h, api) -> str:
    """A job whose pod runs, placed by an executor that has stopped since: the job's id."""
    first = await k8s_executor(h, api)
    job = await h.submit(command="python train.py")
    await h.place(first, job)
    api.set_status(pod(api), phase="Running")
    await first.backend.poll_once()
    await h.wait(job, "running")
    await first.shutdown()
    return job


async def test_a_restarted_executor_adopts_running_pods_and_reports_their_end(h, api):
    job = await running_pod_left_by_a_stopped_executor(h, api)
    assert len(api.pods) == 1  # pods outlive the executor

    again = await k8s_executor(h, api)
    await again.reconcile()
    assert {r.key: r.running for r in again.attempts} == {(job, 1): {0}}
    api.set_status(pod(api), **terminated(0, "Completed"))
    await again.backend.poll_once()
    await h.wait(job, "succeeded")
    assert [t for t in await h.types(job) if t == "started"] == ["started"]  # recorded once


async def test_a_restarted_executor_whose_pods_are_gone_records_the_attempt_lost(h, api):
    job = await running_pod_left_by_a_stopped_executor(h, api)
    api.pods.clear()
    again = await k8s_executor(h, api)
    await again.reconcile()
    view = await h.wait(job, "queued")
    assert view.attempts[0].summary == "requeued: node_lost"


async def test_the_backend_setting_is_checked():
    from pydantic import ValidationError

    from gpuyard.shared.settings.executor import ExecutorSettings

    with pytest.raises(ValidationError, match="'local', 'kubernetes' or 'slurm'"):
        ExecutorSettings(executor_backend="k8s")
    await asyncio.sleep(0)
