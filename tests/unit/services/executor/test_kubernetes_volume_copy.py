"""Volumes kept in the object store (`GPUYARD_VOLUME_STORE`) on the Kubernetes backend: no claim; each pod's init
container, of the platform's image with the store's credentials from a Secret, copies the volumes into an
emptyDir that the job's container mounts read-only; a copy that fails (or an image that cannot be pulled) fails
the replica's start with its reason. Rendered pods validated against Kubernetes' schema; the lifecycle against
`FakeKubeApi` and the embedded event store; the init container's program against moto's S3 server on loopback
(tests/s3server.py), as a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.manifests import build_job_manifests
from gpuyard.services.executor.kubernetes.volumecopy import (
    COPIES_MOUNT,
    COPIES_VOLUME,
    COPY_CONTAINER,
    CopiedVolumes,
    VolumeCopy,
)
from gpuyard.services.executor.kubernetes.volumefetch import main as volumefetch
from gpuyard.services.executor.volumecache import VOLUME_CACHE
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.logs import NOTE
from tests.s3server import S3Server
from tests.unit.services.executor.test_executor_kubernetes import node_log, pod, terminated
from tests.unit.services.executor.test_kubernetes_manifests import NFS, assert_valid, env_of, placements
from tests.unit.services.executor.test_kubernetes_volumes import backend_for

GB = 10**9
IMAGE = "ghcr.io/gpuyard/gpuyard:0.1.0"
COPY = VolumeCopy(store="s3://datasets/gy", image=IMAGE, secret="gpuyard-volume-store")
SPEC = {
    "command": "python train.py",
    "replicas": 2,
    "resources": {"gpus": 1, "cpus": 4, "memory": "16GB"},
    "volumes": [
        {"name": "imagenet", "path": "data", "read_only": True},
        {"name": "labels", "path": "/labels", "read_only": True},
    ],
}


def render(spec: dict, copied: CopiedVolumes, config: KubernetesConfig | None = None):
    job = JobSpec.model_validate(spec)
    return build_job_manifests(
        job_id="j-7f3a",
        attempt=1,
        job_name="train",
        tenant="research",
        spec=job,
        placements=placements(job.replicas, gpus=int(job.resources.gpus)),
        config=config or KubernetesConfig(namespace="jobs"),
        copied=copied,
    )


# ---------------------------------------------------------------------- the pods, rendered


@pytest.mark.parametrize("storage", [{}, NFS], ids=["no-storage", "nfs-storage"])
@pytest.mark.parametrize("secret", [COPY.secret, None], ids=["secret", "no-secret"])
def test_pods_copy_the_volumes_in_an_init_container_and_mount_the_copies_read_only(storage, secret):
    copy = VolumeCopy(store=COPY.store, image=IMAGE, secret=secret)
    config = KubernetesConfig(namespace="jobs", image_pull_policy="Always", shm_size=2**30, **storage)
    manifests = render(SPEC, CopiedVolumes(copy, {"imagenet": 50 * GB, "labels": GB}), config)
    assert_valid(manifests)
    for pod_ in manifests.pods:
        spec = pod_["spec"]
        assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v]  # no claim at all
        [copies] = [v for v in spec["volumes"] if v["name"] == COPIES_VOLUME]
        assert copies == {"name": COPIES_VOLUME, "emptyDir": {"sizeLimit": str(51 * GB)}}
        [init] = spec["initContainers"]
        assert init["name"] == COPY_CONTAINER and init["image"] == IMAGE
        assert init["imagePullPolicy"] == "Always"
        assert init["command"][-4:] == [COPIES_MOUNT, "research", "imagenet", "labels"]
        assert init["env"] == [{"name": "GPUYARD_VOLUME_STORE", "value": COPY.store}]
        # credentials from the Secret alone, never inline, and the job's container has none of them
        assert init.get("envFrom") == ([{"secretRef": {"name": secret}}] if secret else None)
        assert init["volumeMounts"] == [{"name": COPIES_VOLUME, "mountPath": COPIES_MOUNT}]
        job_container = spec["containers"][0]
        assert "envFrom" not in job_container
        # the copy asks what the job asks, its GPU left out: the pod asks no more than before
        assert init["resources"]["limits"] == {"cpu": "4000m", "memory": str(16 * GB)}
        assert job_container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        mounts = {m["mountPath"]: m for m in job_container["volumeMounts"] if m["name"] == COPIES_VOLUME}
        assert mounts == {
            "/workspace/data": {
                "name": COPIES_VOLUME,
                "mountPath": "/workspace/data",
                "subPath": f"{VOLUME_CACHE}/research/imagenet",
                "readOnly": True,
            },
            "/labels": {
                "name": COPIES_VOLUME,
                "mountPath": "/labels",
                "subPath": f"{VOLUME_CACHE}/research/labels",
                "readOnly": True,
            },
        }
        env = env_of(pod_)
        assert (
            env["GPUYARD_VOLUME_IMAGENET"] == "/workspace/data" and env["GPUYARD_VOLUME_LABELS"] == "/labels"
        )
        assert job_container["workingDir"] == "/workspace"


def test_a_job_without_volumes_gets_no_init_container():
    manifests = render({"command": "python train.py"}, CopiedVolumes(COPY, {}))
    assert_valid(manifests)
    assert "initContainers" not in manifests.pods[0]["spec"]
    assert "volumes" not in manifests.pods[0]["spec"]


# ---------------------------------------------------------------------- the lifecycle, against FakeKubeApi


async def k8s_executor(h, api, registry):
    backend = backend_for(h, api, registry, volume_copy=COPY, **NFS)
    return await h.executor(backend=backend, executor_backend="kubernetes")


async def test_a_job_mounting_object_store_volumes_makes_no_claim_and_its_pods_copy_them(h, api, registry):
    await registry.create("team", "imagenet", 50 * GB, 0, "ana")
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(
        command="python train.py", volumes=[{"name": "imagenet", "path": "data", "read_only": True}]
    )
    await h.place(ex, job)
    assert not api.claims and not api.persistent_volumes
    assert not [call for call, _ in api.calls if call in ("create_claim", "create_persistent_volume")]
    [created] = api.pods.values()
    [init] = created["spec"]["initContainers"]
    assert init["command"][-2:] == ["team", "imagenet"]
    [copies] = [v for v in created["spec"]["volumes"] if v["name"] == COPIES_VOLUME]
    assert copies["emptyDir"]["sizeLimit"] == str(50 * GB)


async def test_a_volume_deleted_since_the_job_was_submitted_fails_its_start(h, api, registry):
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(
        command="python train.py", volumes=[{"name": "gone", "path": "data", "read_only": True}]
    )
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert "volume gone was deleted" in view.message and not api.pods


def init_status(state: dict, phase: str) -> dict:
    return {
        "phase": phase,
        "initContainerStatuses": [{"name": COPY_CONTAINER, "state": state}],
        "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}],
    }


COPY_FAILED = {
    "terminated": {
        "exitCode": 1,
        "reason": "Error",
        "message": "cannot copy volume 'imagenet' from the object store: PermissionError: Access Denied",
    }
}
PULL_REFUSED = {"waiting": {"reason": "ErrImageNeverPull", "message": f"image {IMAGE} is not present"}}


@pytest.mark.parametrize(
    ("state", "phase", "words"),
    [
        (
            COPY_FAILED,
            "Failed",
            "init container copy-volumes failed (exit code 1): cannot copy volume 'imagenet'",
        ),
        (PULL_REFUSED, "Pending", f"ErrImageNeverPull: image {IMAGE} is not present"),
    ],
    ids=["copy-failed", "image-not-pulled"],
)
async def test_a_copy_that_fails_fails_the_start_with_its_reason(h, api, registry, state, phase, words):
    await registry.create("team", "imagenet", GB, 0, "ana")
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(
        command="python train.py", volumes=[{"name": "imagenet", "path": "data", "read_only": True}]
    )
    await h.place(ex, job)
    api.set_status(pod(api), **init_status(state, phase))
    await ex.backend.poll_once()
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed", view
    assert words in view.message


# ---------------------------------------------------------------------- the init container's program


def put(server: S3Server, bucket: str, name: str, path: str, data: bytes) -> None:
    server.client().put_object(Bucket=bucket, Key=f"gy/volumes/research/{name}/{path}", Body=data)


def test_the_init_container_copies_each_volume_into_the_pod_readable_by_any_user(s3_server, bucket, tmp_path):
    put(s3_server, bucket, "imagenet", "train/a b.bin", b"a" * 1000)
    put(s3_server, bucket, "imagenet", "labels.csv", b"x,y\n")
    put(s3_server, bucket, "tokens", "vocab.txt", b"hello\n")
    root = tmp_path / "copies"
    env = {**os.environ, "GPUYARD_VOLUME_STORE": f"s3://{bucket}/gy"}
    command = [sys.executable, "-P", "-m", "gpuyard.services.executor.kubernetes.volumefetch"]
    done = subprocess.run(
        [*command, str(root), "research", "imagenet", "tokens"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "volume imagenet: copied 2 files (1004 B) from the object store" in done.stdout
    assert "volume tokens: copied 1 file (6 B) from the object store" in done.stdout
    imagenet = root / VOLUME_CACHE / "research" / "imagenet"
    assert (imagenet / "train" / "a b.bin").read_bytes() == b"a" * 1000
    assert (root / VOLUME_CACHE / "research" / "tokens" / "vocab.txt").read_bytes() == b"hello\n"
    assert os.stat(imagenet).st_mode & 0o777 == 0o755  # (the job's container may run as another user)
    assert os.stat(imagenet / "labels.csv").st_mode & 0o777 == 0o644


def test_a_store_that_cannot_be_read_fails_the_init_container_with_the_reason(
    bucket, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("GPUYARD_VOLUME_STORE", f"s3://{bucket}-not-there/gy")
    assert volumefetch([str(tmp_path / "copies"), "research", "imagenet"]) == 1
    assert "cannot copy volume 'imagenet' from the object store" in capsys.readouterr().err


def test_without_a_store_or_volumes_it_says_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPUYARD_VOLUME_STORE", raising=False)
    assert volumefetch([str(tmp_path), "research", "imagenet"]) == 2
    assert "GPUYARD_VOLUME_STORE is not set" in capsys.readouterr().err
    assert volumefetch([str(tmp_path)]) == 2
    assert "usage:" in capsys.readouterr().err


async def test_what_the_copy_said_comes_first_in_each_replicas_log(h, api, registry):
    await registry.create("team", "imagenet", GB, 0, "ana")
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(
        command="python train.py",
        replicas=2,
        volumes=[{"name": "imagenet", "path": "data", "read_only": True}],
    )
    await h.place(ex, job, nodes=["gpu-1", "gpu-2"])
    for r in (0, 1):
        api.init_logs[(pod(api, r), COPY_CONTAINER)] = f"volume imagenet: copied {r + 1} file(s)\n"
        api.logs[pod(api, r)] = f"epoch 1 of replica {r}\n"
        api.set_status(pod(api, r), phase="Running")
    await ex.backend.poll_once()
    await h.wait(job, "running")
    api.logs[pod(api, 0)] += "done\n"
    for r in (0, 1):
        api.set_status(pod(api, r), **terminated(0, "Completed"))
    await ex.backend.poll_once()
    await h.wait(job, "succeeded")
    assert node_log(h, job, 0) == f"{NOTE}volume imagenet: copied 1 file(s)\nepoch 1 of replica 0\ndone\n"
    assert node_log(h, job, 1) == f"{NOTE}volume imagenet: copied 2 file(s)\nepoch 1 of replica 1\n"


async def test_a_failed_copy_says_why_in_the_log_too(h, api, registry):
    await registry.create("team", "imagenet", GB, 0, "ana")
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(
        command="python train.py", volumes=[{"name": "imagenet", "path": "data", "read_only": True}]
    )
    await h.place(ex, job)
    words = COPY_FAILED["terminated"]["message"]
    api.init_logs[(pod(api), COPY_CONTAINER)] = words + "\n"
    api.set_status(pod(api), **init_status(COPY_FAILED, "Failed"))
    await ex.backend.poll_once()
    await h.wait(job, "failed")
    assert node_log(h, job, 0) == f"{NOTE}{words}\n"
