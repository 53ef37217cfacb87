"""Jobs' outputs copied to the output store on the Kubernetes backend: once an attempt's last pod has ended (or
its pods were deleted by a stop and are gone), the executor copies the job's output folder from its storage root
(where it mounts the NFS export the pods write to) to the store, before that replica's end is reported, and the
last replica's log says what was copied or why not; a copy that fails never fails the job. Through `Executor`
against `FakeKubeApi`, the copy itself against moto's S3 server on loopback (tests/s3server.py)."""

from __future__ import annotations

from pathlib import Path

from gpuyard.services.executor.outputpublish import OutputPublisher
from gpuyard.shared.contracts.events.jobs import JobCancelRequested
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.paths import job_storage, log_path
from gpuyard.shared.stores.logs import NOTE
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry
from tests.unit.services.executor.test_executor_kubernetes import pod, terminated
from tests.unit.services.executor.test_kubernetes_manifests import NFS
from tests.unit.services.executor.test_kubernetes_volumes import backend_for

PREFIX = "kept"


async def k8s_executor(h, api, storage_root: Path, store_url: str, **config):
    outputs = OutputPublisher(OutputStore(store_url), storage_root, lambda _tenant: None)
    backend = backend_for(h, api, VolumeRegistry(h.store, None, "/test"), outputs=outputs, **config)
    return await h.executor(backend=backend, executor_backend="kubernetes")


def write_outputs(storage_root: Path, job: str) -> None:
    """What the job's pods write to /gpuyard/outputs, as the executor sees it on the export."""
    outputs = Path(job_storage(storage_root, "team", job).outputs)
    (outputs / "sub dir").mkdir(parents=True)
    (outputs / "result.txt").write_text("42")
    (outputs / "sub dir" / "métrique.tsv").write_text("step\tloss\n1\t0.5\n")


def node_log(h, job: str, replica: int) -> str:
    return log_path(h.data_dir, job, 1, replica).read_text()


async def run_to_the_end(h, api, ex, job: str, replicas: int = 1) -> None:
    for r in range(replicas):
        api.set_status(pod(api, r), phase="Running")
    await ex.backend.poll_once()
    await h.wait(job, "running")
    for r in range(replicas):
        api.logs[pod(api, r)] = f"replica {r} done\n"
        api.set_status(pod(api, r), **terminated(0, "Completed"))
    await ex.backend.poll_once()


async def test_a_jobs_outputs_are_in_the_store_once_it_is_seen_ended_and_its_log_says_so(
    h, api, s3_server, bucket, tmp_path
):
    storage = tmp_path / "storage"
    ex = await k8s_executor(h, api, storage, f"s3://{bucket}/{PREFIX}", **NFS)
    job = await h.submit(command="python train.py", replicas=2)
    await h.place(ex, job, nodes=["gpu-1", "gpu-2"])
    write_outputs(storage, job)
    await run_to_the_end(h, api, ex, job, replicas=2)
    view = await h.wait(job, "succeeded")
    assert view.exit_code == 0
    # the end was reported after the copy: the objects are there as soon as the job is seen ended
    assert s3_server.objects(bucket, f"{PREFIX}/outputs/team/{job}") == {
        "result.txt": 2,
        "sub dir/métrique.tsv": len(b"step\tloss\n1\t0.5\n"),
    }
    logs = node_log(h, job, 0) + node_log(h, job, 1)
    assert logs.count("outputs: copied 2 file(s), 18 B, to the output store") == 1
    assert "replica 0 done" in logs and "replica 1 done" in logs


async def test_a_copy_that_fails_is_said_in_the_log_and_the_job_still_succeeds(h, api, bucket, tmp_path):
    storage = tmp_path / "storage"
    ex = await k8s_executor(h, api, storage, f"s3://{bucket}-not-there/{PREFIX}", **NFS)
    job = await h.submit(command="python train.py")
    await h.place(ex, job)
    write_outputs(storage, job)
    await run_to_the_end(h, api, ex, job)
    view = await h.wait(job, "succeeded")
    assert view.exit_code == 0
    text = node_log(h, job, 0)
    assert "replica 0 done" in text
    assert "outputs: not copied to the output store (" in text


async def test_a_cancelled_job_has_its_outputs_copied_once_its_pods_are_gone(
    h, api, s3_server, bucket, tmp_path
):
    storage = tmp_path / "storage"
    ex = await k8s_executor(h, api, storage, f"s3://{bucket}/{PREFIX}", **NFS)
    job = await h.submit(command="sleep 1000")
    await h.place(ex, job)
    api.set_status(pod(api), phase="Running")
    api.logs[pod(api)] = "working\n"
    await ex.backend.poll_once()
    await h.wait(job, "running")
    write_outputs(storage, job)
    api.logs[pod(api)] += "saved on SIGTERM\n"  # (not copied yet: the pod's last lines, read before it goes)
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    await h.wait(job, "cancelled")
    assert not api.pods
    assert sorted(s3_server.objects(bucket, f"{PREFIX}/outputs/team/{job}")) == [
        "result.txt",
        "sub dir/métrique.tsv",
    ]
    text = node_log(h, job, 0)
    assert text == f"working\nsaved on SIGTERM\n{NOTE}outputs: copied 2 file(s), 18 B, to the output store\n"


async def test_without_the_nfs_export_nothing_is_copied(h, api, s3_server, bucket, tmp_path):
    storage = tmp_path / "storage"
    ex = await k8s_executor(h, api, storage, f"s3://{bucket}/{PREFIX}")
    job = await h.submit(command="python train.py")
    await h.place(ex, job)
    write_outputs(storage, job)  # (a folder the pods cannot have written: they have no output folder)
    await run_to_the_end(h, api, ex, job)
    await h.wait(job, "succeeded")
    assert s3_server.objects(bucket, f"{PREFIX}/outputs/team/{job}") == {}
    assert "outputs:" not in node_log(h, job, 0)


async def test_an_executor_that_adopted_the_pods_copies_the_outputs_when_they_end(
    h, api, s3_server, bucket, tmp_path
):
    storage, url = tmp_path / "storage", f"s3://{bucket}/{PREFIX}"
    first = await k8s_executor(h, api, storage, url, **NFS)
    job = await h.submit(command="python train.py")
    await h.place(first, job)
    api.set_status(pod(api), phase="Running")
    await first.backend.poll_once()
    await h.wait(job, "running")
    await first.shutdown()  # (its pod outlives it)

    again = await k8s_executor(h, api, storage, url, **NFS)
    await again.reconcile()
    write_outputs(storage, job)
    api.set_status(pod(api), **terminated(0, "Completed"))
    await again.backend.poll_once()
    await h.wait(job, "succeeded")
    assert sorted(s3_server.objects(bucket, f"{PREFIX}/outputs/team/{job}")) == [
        "result.txt",
        "sub dir/métrique.tsv",
    ]  # (the tenant, which the copy needs, read from the adopted pod's labels)
