"""Volumes, checkpoints and outputs on the Kubernetes backend: one PersistentVolumeClaim per volume (bound to a
PersistentVolume of its folder on the storage root's NFS export when that is set), made before the pods, mounted
by every pod of the jobs that name it, deleted once its volume is; the job's checkpoint and output folders from
the export. Rendered objects validated against Kubernetes' schema; the lifecycle against `FakeKubeApi` and a real
embedded event store."""

from __future__ import annotations

import logging

import kubernetes_validate
import pytest

from gpuyard.services.executor.backend import AttemptLaunch
from gpuyard.services.executor.kubernetes.api import KubeApiError
from gpuyard.services.executor.kubernetes.backend import RECONCILE_EVERY_POLLS, KubernetesBackend
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.controller import KubernetesController
from gpuyard.services.executor.kubernetes.names import persistent_volume_name, volume_claim_name
from gpuyard.services.executor.kubernetes.podvolumes import NO_STORAGE_NOTE, mount_places
from gpuyard.services.executor.kubernetes.volumeclaims import ClaimRefused, created_of
from gpuyard.services.executor.kubernetes.volumeobjects import volume_objects
from gpuyard.shared.contracts.events.jobs import JobStarted, ReplicaPlacement
from gpuyard.shared.contracts.events.volumes import VolumeDeleted
from gpuyard.shared.contracts.jobspec import JobSpec
from tests.unit.services.executor.fake_kube_api import FakeKubeApi
from tests.unit.services.executor.test_kubernetes_manifests import (
    DNS_1035,
    K8S_VERSIONS,
    LABEL_VALUE,
    NFS,
    env_of,
    render,
)

GB = 10**9
CREATED = "2025-05-01T12:00:00.123456+00:00"
TWO_VOLUMES = [
    {"name": "imagenet", "path": "data", "read_only": True},
    {"name": "scratch", "path": "/scratch"},
]


def assert_valid_object(obj: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)
    assert DNS_1035.match(obj["metadata"]["name"]), obj["metadata"]["name"]
    for key, value in obj["metadata"]["labels"].items():
        assert LABEL_VALUE.match(value) and len(value) <= 63, (key, value)


# ---------------------------------------------------------------------- the objects, rendered


@pytest.mark.parametrize("storage_class", [None, "cephfs"])
@pytest.mark.parametrize("storage", [{}, NFS], ids=["dynamic", "nfs"])
def test_claims_and_persistent_volumes_are_schema_valid(storage, storage_class):
    config = KubernetesConfig(
        namespace="jobs", volume_storage_class=storage_class, extra_labels={"team": "ml"}, **storage
    )
    objects = volume_objects(
        tenant="research", volume="imagenet", size_bytes=50 * GB, created=CREATED, config=config
    )
    assert_valid_object(objects.claim)
    assert (objects.persistent_volume is not None) == bool(storage)
    if objects.persistent_volume is not None:
        assert_valid_object(objects.persistent_volume)


def test_a_claim_is_read_write_many_of_the_volumes_size_in_the_class_asked_labelled_and_annotated():
    objects = volume_objects(
        tenant="research", volume="imagenet", size_bytes=50 * GB, created=CREATED, config=KubernetesConfig()
    )
    claim = objects.claim
    assert claim["metadata"]["namespace"] == "default"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "50000000000"}},
    }
    assert claim["metadata"]["labels"] == {
        "app.kubernetes.io/part-of": "gpuyard",
        "app.kubernetes.io/managed-by": "gpuyard",
        "app.kubernetes.io/component": "volume",
        "gpuyard.io/tenant": "research",
        "gpuyard.io/volume": "imagenet",
    }
    assert claim["metadata"]["annotations"] == {
        "gpuyard.io/tenant": "research",
        "gpuyard.io/volume": "imagenet",
        "gpuyard.io/volume-created": CREATED,
    }
    assert objects.persistent_volume is None  # provisioned by the cluster's default class
    classed = volume_objects(
        tenant="research",
        volume="imagenet",
        size_bytes=GB,
        created=CREATED,
        config=KubernetesConfig(volume_storage_class="cephfs"),
    )
    assert classed.claim["spec"]["storageClassName"] == "cephfs"


def test_claim_names_are_dns_labels_stable_and_unique_per_volume():
    name = volume_claim_name("gy", "research", "imagenet", CREATED)
    assert name == volume_claim_name("gy", "research", "imagenet", CREATED)  # the same volume, the same claim
    assert name.startswith("gy-research-imagenet-") and DNS_1035.match(name)
    others = {
        volume_claim_name("gy", "research", "imagenet2", CREATED),
        volume_claim_name("gy", "vision", "imagenet", CREATED),
        volume_claim_name("gy", "research", "imagenet", "2025-06-01T00:00:00+00:00"),  # made again
        volume_claim_name("gy", "a-b", "c", CREATED),
        volume_claim_name("gy", "a", "b-c", CREATED),
    }
    assert len(others | {name}) == 6
    longest = volume_claim_name("abcdefgh", "t" * 63, "v" * 63, CREATED)
    assert len(longest) <= 63 and DNS_1035.match(longest)
    # a PersistentVolume is cluster-wide: two namespaces never share one
    assert persistent_volume_name("gy", "jobs", "research", "imagenet", CREATED) != persistent_volume_name(
        "gy", "jobs-2", "research", "imagenet", CREATED
    )


def test_with_the_nfs_export_each_claim_is_bound_to_a_persistent_volume_of_the_volumes_folder():
    config = KubernetesConfig(namespace="jobs", **NFS)
    objects = volume_objects(
        tenant="research", volume="imagenet", size_bytes=5 * GB, created=CREATED, config=config
    )
    pv = objects.persistent_volume
    assert pv is not None
    assert pv["spec"] == {
        "capacity": {"storage": "5000000000"},
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "nfs": {"server": "nfs.storage.svc", "path": "/exports/gpuyard/volumes/research/imagenet"},
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": "jobs",
            "name": objects.claim_name,
        },
    }
    # no class on either side: the cluster's default class does not take the claim
    assert objects.claim["spec"]["storageClassName"] == ""
    assert objects.claim["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["metadata"]["labels"]["gpuyard.io/namespace"] == "jobs"


def test_the_nfs_settings_go_together_and_the_path_is_absolute():
    with pytest.raises(ValueError, match="set together"):
        KubernetesConfig(volume_nfs_server="nfs")
    with pytest.raises(ValueError, match="set together"):
        KubernetesConfig(volume_nfs_path="/exports")
    with pytest.raises(ValueError, match="volume_nfs_path"):
        KubernetesConfig(volume_nfs_server="nfs", volume_nfs_path="exports")
    assert KubernetesConfig(volume_nfs_server="", volume_nfs_path="").nfs_export is None


@pytest.mark.parametrize("storage", [{}, NFS], ids=["no-storage", "nfs-storage"])
def test_every_pod_mounts_each_claim_at_its_path_read_only_when_asked(storage):
    manifests = render(
        {"command": "python train.py", "replicas": 2, "volumes": TWO_VOLUMES},
        config=KubernetesConfig(namespace="jobs", **storage),
    )
    for pod in manifests.pods:
        container = pod["spec"]["containers"][0]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        data, scratch = mounts["/workspace/data"], mounts["/scratch"]
        assert data["readOnly"] is True and scratch["readOnly"] is False
        assert volumes[data["name"]]["persistentVolumeClaim"] == {
            "claimName": "gy-research-imagenet-0123456789",
            "readOnly": True,
        }
        assert volumes[scratch["name"]]["persistentVolumeClaim"] == {
            "claimName": "gy-research-scratch-0123456789",
            "readOnly": False,
        }
        # a relative path is under the working directory, which the pod then has
        assert container["workingDir"] == "/workspace"
        env = env_of(pod)
        assert env["GPUYARD_VOLUME_IMAGENET"] == "/workspace/data"
        assert env["GPUYARD_VOLUME_SCRATCH"] == "/scratch"


@pytest.mark.parametrize(
    ("working_dir", "path", "place", "pod_dir"),
    [
        (None, "data", "/workspace/data", "/workspace"),
        ("/code", "data/set", "/code/data/set", None),  # the spec's own working directory is kept
        ("src", "data", "/workspace/src/data", "/workspace/src"),
        (None, "/mnt/data", "/mnt/data", None),  # an absolute path changes nothing else
    ],
)
def test_where_a_volume_is_mounted(working_dir, path, place, pod_dir):
    spec = JobSpec.model_validate(
        {"command": "x", "working_dir": working_dir, "volumes": [{"name": "set", "path": path}]}
    )
    assert mount_places(spec, KubernetesConfig()) == ({"set": place}, pod_dir)
    (pod,) = render(spec.model_dump(exclude_none=True)).pods
    assert pod["spec"]["containers"][0].get("workingDir") == (pod_dir or working_dir)


def test_with_the_nfs_export_every_pod_gets_its_checkpoint_and_output_folders():
    manifests = render({"command": "x", "replicas": 2}, config=KubernetesConfig(namespace="jobs", **NFS))
    for pod in manifests.pods:
        (storage,) = pod["spec"]["volumes"]
        assert storage == {
            "name": "gpuyard-storage",
            "nfs": {"server": "nfs.storage.svc", "path": "/exports/gpuyard"},
        }
        assert pod["spec"]["containers"][0]["volumeMounts"] == [
            {
                "name": "gpuyard-storage",
                "mountPath": "/gpuyard/checkpoints",
                "subPath": "checkpoints/research/j-7f3a",
            },
            {
                "name": "gpuyard-storage",
                "mountPath": "/gpuyard/outputs",
                "subPath": "outputs/research/j-7f3a",
            },
        ]
        env = env_of(pod)
        assert env["GPUYARD_CHECKPOINT_DIR"] == "/gpuyard/checkpoints"
        assert env["GPUYARD_OUTPUT_DIR"] == "/gpuyard/outputs"


def test_without_the_nfs_export_a_pod_has_no_storage_folders():
    (pod,) = render({"command": "x"}).pods
    assert "volumes" not in pod["spec"]
    assert not {"GPUYARD_CHECKPOINT_DIR", "GPUYARD_OUTPUT_DIR"} & set(env_of(pod))


# ---------------------------------------------------------------------- the lifecycle, against FakeKubeApi


def backend_for(h, api, registry, *, volume_copy=None, outputs=None, **config) -> KubernetesBackend:
    """A backend on the fake API whose jobs' volumes are `registry`'s (polled by the tests, its logs copied at
    every poll); `volume_copy`, `outputs` and `config` as the backend and its settings take them."""
    controller = KubernetesController(api, KubernetesConfig(namespace="jobs", **config))
    return KubernetesBackend(
        controller,
        data_dir=h.data_dir,
        poll_interval=3600,
        log_interval=0,
        volumes=registry.get,
        volume_copy=volume_copy,
        outputs=outputs,
    )


async def k8s_executor(h, api, registry, **config):
    return await h.executor(backend=backend_for(h, api, registry, **config), executor_backend="kubernetes")


async def make_volumes(registry, tenant="team", **sizes: int):
    return {name: await registry.create(tenant, name, size, 0, "ana") for name, size in sizes.items()}


async def deleted_in_a_race(registry, tenant: str, name: str) -> None:
    """The volume's deletion recorded as if it had raced the job's submission (the registry refuses to delete a
    volume that a live job mounts)."""

    async def decide(view):
        return VolumeDeleted(name=name, tenant=tenant, bytes=0, by="ana")

    await registry.record(tenant, name, decide)


def mounts(*volumes: dict):
    """The `volumes` of a spec, as the backend gets them."""
    return JobSpec.model_validate({"command": "x", "volumes": list(volumes)}).volumes


def launch_of(job_id: str, spec: dict, tenant: str = "team") -> AttemptLaunch:
    job = JobSpec.model_validate(spec)
    placements = [ReplicaPlacement(replica=r, node="gpu-1", cpus=1) for r in range(job.replicas)]
    return AttemptLaunch(
        job_id=job_id,
        job_name="unit",
        tenant=tenant,
        attempt=1,
        spec=job,
        placements=placements,
        replicas=[p.replica for p in placements],
        master_addr="",
        master_port=0,
    )


async def started_notes(h, job: str) -> list[str]:
    return [
        note for e in await h.ledger.events(job) if isinstance(e.data, JobStarted) for note in e.data.notes
    ]


async def test_a_job_mounting_two_volumes_makes_each_claim_once_and_every_pod_mounts_them(h, api, registry):
    views = await make_volumes(registry, imagenet=50 * GB, scratch=GB)
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(command="python train.py", replicas=2, volumes=TWO_VOLUMES)
    await h.place(ex, job, nodes=["gpu-1", "gpu-2"])
    claims = {c["metadata"]["annotations"]["gpuyard.io/volume"]: c for c in api.claims.values()}
    assert sorted(claims) == ["imagenet", "scratch"]
    assert claims["imagenet"]["spec"]["resources"]["requests"]["storage"] == str(50 * GB)
    assert claims["scratch"]["spec"]["resources"]["requests"]["storage"] == str(GB)
    assert claims["imagenet"]["metadata"]["name"] == volume_claim_name(
        "gy", "team", "imagenet", created_of(views["imagenet"])
    )
    # the claims were made before the pods
    creates = [call for call, _ in api.calls if call.startswith("create_")]
    assert creates[:2] == ["create_claim", "create_claim"] and "create_claim" not in creates[2:]
    assert len(api.pods) == 2
    for pod in api.pods.values():
        mounted = {
            v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"]["readOnly"]
            for v in pod["spec"]["volumes"]
        }
        assert mounted == {
            claims["imagenet"]["metadata"]["name"]: True,
            claims["scratch"]["metadata"]["name"]: False,
        }
    # a second job that mounts one of them uses its claim: nothing made twice
    other = await h.submit(command="python eval.py", volumes=[{"name": "imagenet", "path": "data"}])
    await h.place(ex, other, nodes=["gpu-1"])
    assert len(api.claims) == 2 and len(api.pods) == 3
    # no export set: the attempt's start says it has no checkpoint or output folder
    for name in list(api.pods):
        api.set_status(name, phase="Running")
    await ex.backend.poll_once()
    await h.wait(job, "running")
    assert NO_STORAGE_NOTE in await started_notes(h, job)


async def test_a_repeated_launch_creates_nothing_twice(h, api, registry):
    await make_volumes(registry, imagenet=GB, scratch=GB)
    backend = backend_for(h, api, registry)
    launch = launch_of("j-1", {"command": "x", "replicas": 2, "volumes": TWO_VOLUMES})
    assert await backend.launch(launch) is None
    first = {name: claim["metadata"]["uid"] for name, claim in api.claims.items()}
    pods = {name: pod["metadata"]["uid"] for name, pod in api.pods.items()}
    assert await backend.launch(launch) is None  # a redelivered placement
    assert {name: claim["metadata"]["uid"] for name, claim in api.claims.items()} == first
    assert {name: pod["metadata"]["uid"] for name, pod in api.pods.items()} == pods
    assert len(first) == 2 and len(pods) == 2


async def test_a_volume_deleted_since_the_job_was_submitted_fails_its_start(h, api, registry):
    await make_volumes(registry, imagenet=GB)
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(command="python train.py", volumes=[{"name": "imagenet", "path": "data"}])
    await deleted_in_a_race(registry, "team", "imagenet")
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and view.message == "replica 0: volume imagenet was deleted"
    assert not api.claims and not api.pods


async def test_a_claim_the_api_server_refuses_fails_the_start_with_its_words(h, api, registry):
    views = await make_volumes(registry, imagenet=GB)
    name = volume_claim_name("gy", "team", "imagenet", created_of(views["imagenet"]))
    api.fail_once[name] = KubeApiError(403, "persistentvolumeclaims is forbidden: exceeded quota")
    ex = await k8s_executor(h, api, registry)
    job = await h.submit(command="python train.py", volumes=[{"name": "imagenet", "path": "data"}])
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed"
    assert view.message == (
        "replica 0: Kubernetes refused the claim of volume imagenet: persistentvolumeclaims is forbidden: "
        "exceeded quota"
    )
    assert not api.pods


async def test_the_reconcile_deletes_the_claims_of_deleted_volumes_and_keeps_the_others(h, api, registry):
    await make_volumes(registry, imagenet=GB, scratch=GB)
    backend = backend_for(h, api, registry)
    claims = await backend.claims.claim("team", mounts(*TWO_VOLUMES))
    foreign = {  # labelled as GPUYARD's, without its annotations: not one it made
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "by-hand", "labels": dict(api.claims[claims["scratch"]]["metadata"]["labels"])},
        "spec": {},
    }
    await api.create_claim("jobs", foreign)
    assert await backend.claims.reconcile() == []  # every volume there: nothing deleted

    await registry.delete("team", "imagenet", 0, "ana")
    assert await backend.claims.reconcile() == [claims["imagenet"]]
    assert sorted(api.claims) == sorted(["by-hand", claims["scratch"]])
    assert await backend.claims.reconcile() == []  # idempotent

    # deleted and made again under its name: the old claim goes, the new volume gets a new one
    await registry.delete("team", "scratch", 0, "ana")
    await make_volumes(registry, scratch=2 * GB)
    again = (await backend.claims.claim("team", mounts(TWO_VOLUMES[1])))["scratch"]
    assert again != claims["scratch"]
    assert await backend.claims.reconcile() == [claims["scratch"]]
    assert sorted(api.claims) == sorted(["by-hand", again])
    assert api.claims[again]["spec"]["resources"]["requests"]["storage"] == str(2 * GB)


async def test_the_poll_loop_reconciles_every_few_polls(h, api, registry):
    await make_volumes(registry, imagenet=GB)
    backend = backend_for(h, api, registry)
    assert await backend.launch(launch_of("j-1", {"command": "x", "volumes": TWO_VOLUMES[:1]})) is None
    await api.delete_pods("jobs", "app.kubernetes.io/managed-by=gpuyard", 0)
    await registry.delete("team", "imagenet", 0, "ana")
    backend.polls = RECONCILE_EVERY_POLLS  # (the first poll, and every RECONCILE_EVERY_POLLS-th, reconcile)
    await backend.poll_once()
    assert not api.claims and backend.polls == RECONCILE_EVERY_POLLS + 1


async def test_a_store_that_cannot_be_read_deletes_no_claim(h, api, registry, caplog):
    await make_volumes(registry, imagenet=GB)
    backend = backend_for(h, api, registry)
    await backend.claims.claim("team", mounts(TWO_VOLUMES[0]))

    async def unreadable(tenant: str, name: str):
        raise OSError("database is locked")

    backend.claims.lookup = unreadable
    with caplog.at_level(logging.WARNING):
        await backend.reconcile_claims()
    assert len(api.claims) == 1
    assert "database is locked" in caplog.text


async def test_with_the_nfs_export_volumes_are_persistent_volumes_and_pods_get_their_storage(
    h, api, registry
):
    await make_volumes(registry, imagenet=5 * GB)
    ex = await k8s_executor(h, api, registry, **NFS)
    job = await h.submit(
        command="python train.py", volumes=[{"name": "imagenet", "path": "data", "read_only": True}]
    )
    await h.place(ex, job, nodes=["gpu-1"])
    (pv,) = api.persistent_volumes.values()
    (claim,) = api.claims.values()
    assert pv["spec"]["nfs"] == {
        "server": "nfs.storage.svc",
        "path": "/exports/gpuyard/volumes/team/imagenet",
    }
    assert pv["spec"]["claimRef"]["name"] == claim["metadata"]["name"]
    assert claim["spec"]["volumeName"] == pv["metadata"]["name"]
    creates = [call for call, _ in api.calls if call.startswith("create_")]
    assert creates[:2] == ["create_persistent_volume", "create_claim"]
    (pod,) = api.pods.values()
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/gpuyard/checkpoints"]["subPath"] == f"checkpoints/team/{job}"
    assert mounts["/gpuyard/outputs"]["subPath"] == f"outputs/team/{job}"
    assert mounts["/workspace/data"]["readOnly"] is True
    env = env_of(pod)
    assert (env["GPUYARD_CHECKPOINT_DIR"], env["GPUYARD_OUTPUT_DIR"]) == (
        "/gpuyard/checkpoints",
        "/gpuyard/outputs",
    )
    api.set_status(pod["metadata"]["name"], phase="Running")
    await ex.backend.poll_once()
    await h.wait(job, "running")
    assert NO_STORAGE_NOTE not in await started_notes(h, job)
    # the volume deleted (its job over): its claim and PersistentVolume go
    api.set_status(pod["metadata"]["name"], phase="Succeeded", containerStatuses=[])
    await ex.backend.poll_once()
    await h.wait(job, "succeeded")
    await registry.delete("team", "imagenet", 0, "ana")
    assert sorted(await ex.backend.claims.reconcile()) == sorted(
        [claim["metadata"]["name"], pv["metadata"]["name"]]
    )
    assert not api.claims and not api.persistent_volumes


async def test_the_built_backend_finds_volumes_in_the_executors_store(h, registry, monkeypatch):
    from gpuyard.services.executor.backends import make_backend

    fake = FakeKubeApi(namespace="jobs")
    monkeypatch.setattr(
        "gpuyard.services.executor.kubernetes.client_api.ClientKubeApi.from_environment",
        lambda kubeconfig=None: fake,
    )
    await make_volumes(registry, imagenet=GB)
    settings = h.settings(executor_backend="kubernetes", kubernetes=KubernetesConfig(namespace="jobs"))
    backend = make_backend(settings, simulated=True, gpu_memory={}, store=h.store)
    assert await backend.claims.claim("team", mounts(TWO_VOLUMES[0])) == {"imagenet": next(iter(fake.claims))}
    without = make_backend(settings, simulated=True, gpu_memory={})
    with pytest.raises(ClaimRefused, match="no event store"):
        await without.claims.claim("team", mounts(TWO_VOLUMES[0]))
