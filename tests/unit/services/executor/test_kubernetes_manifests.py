"""The pods and Services the Kubernetes backend renders: valid against the Kubernetes OpenAPI schema (offline,
kubernetes_validate, strict: unknown fields are errors) and carrying what each replica needs."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from gpuyard.services.executor.kubernetes.config import FractionalGpuMode, KubernetesConfig, OwnerTarget
from gpuyard.services.executor.kubernetes.manifests import JobManifests, build_job_manifests, with_owner
from gpuyard.services.executor.kubernetes.names import attempt_names, label_value
from gpuyard.shared.contracts.events.jobs import GpuShare, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec

K8S_VERSIONS = ["1.33", kubernetes_validate.utils.latest_version()]
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def placements(count: int, *, gpus: int = 0, fraction: float | None = None, memory: int | None = None):
    shares = []
    if gpus:
        shares = [GpuShare(index=i, uuid=f"GPU-{i}") for i in range(gpus)]
    if fraction is not None:
        shares = [GpuShare(index=0, fraction=fraction, memory_bytes=memory)]
    return [
        ReplicaPlacement(replica=r, node=f"gpu-node-{r // 2}", gpus=shares, cpus=4, memory_bytes=16 * 10**9)
        for r in range(count)
    ]


def render(
    spec: dict, *, config: KubernetesConfig | None = None, job_name="train", **placement
) -> JobManifests:
    job = JobSpec.model_validate(spec)
    return build_job_manifests(
        job_id="j-7f3a",
        attempt=2,
        job_name=job_name,
        tenant="research",
        spec=job,
        placements=placements(job.replicas, **placement),
        config=config or KubernetesConfig(namespace="jobs"),
        claims={v.name: f"gy-research-{v.name}-0123456789" for v in job.volumes},
    )


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def limits_of(pod: dict) -> dict[str, str]:
    return pod["spec"]["containers"][0]["resources"]["limits"]


def assert_valid(manifests: JobManifests) -> None:
    for obj in ([manifests.service] if manifests.service else []) + manifests.pods:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        assert DNS_1035.match(obj["metadata"]["name"]), obj["metadata"]["name"]
        for key, value in obj["metadata"]["labels"].items():
            assert LABEL_VALUE.match(value) and len(value) <= 63, (key, value)


SPECS = {
    "cpu-only": {"command": "python train.py"},
    "one-gpu": {"command": ["python", "train.py"], "resources": {"gpus": 1}, "timeout": "2h"},
    "eight-gpus-4-replicas": {"command": "torchrun train.py", "resources": {"gpus": 8}, "replicas": 4},
    "fraction": {"command": "python x.py", "resources": {"gpus": 0.25, "gpu_memory": "10GiB"}},
    "fraction-no-memory": {"command": "python x.py", "resources": {"gpus": 0.5}},
    "everything": {
        "command": "python train.py --lr 3e-4",
        "working_dir": "/workspace",
        "env": {"WANDB_MODE": "offline", "RANK": "99"},
        "resources": {"gpus": 2, "cpus": 7.5, "memory": "60GB", "gpu_model": ["H100"]},
        "replicas": 3,
        "timeout": 90.5,
    },
    "volumes": {
        "command": "python train.py --data data/imagenet",
        "resources": {"gpus": 1},
        "replicas": 2,
        "volumes": [
            {"name": "imagenet", "path": "data/imagenet", "read_only": True},
            {"name": "scratch", "path": "/scratch"},
        ],
    },
}
NFS = {"volume_nfs_server": "nfs.storage.svc", "volume_nfs_path": "/exports/gpuyard"}


@pytest.mark.parametrize("storage", [{}, NFS], ids=["no-storage", "nfs-storage"])
@pytest.mark.parametrize("mode", list(FractionalGpuMode))
@pytest.mark.parametrize("name", list(SPECS))
def test_every_rendering_is_schema_valid(name, mode, storage):
    config = KubernetesConfig(
        namespace="jobs",
        fractional_gpu_mode=mode,
        service_account="jobs",
        image_pull_secrets=["registry"],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        extra_labels={"team": "ml"},
        shm_size=8 * 2**30,
        owner=OwnerTarget(api_version="apps/v1", kind="Deployment", name="executor", uid="u-1"),
        **storage,
    )
    spec = SPECS[name]
    gpus = spec.get("resources", {}).get("gpus", 0)
    extra = {"fraction": gpus} if 0 < gpus < 1 else {"gpus": int(gpus)}
    manifests = render(spec, config=config, **extra)
    assert_valid(manifests)
    # the controller adds replica 0 as owner of the rest: still valid
    owned = with_owner(manifests.pods[-1], {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"})
    kubernetes_validate.validate(owned, K8S_VERSIONS[0], strict=True)


def test_single_replica_pod_basics():
    (pod,) = render({"command": "echo hi && sleep 1", "timeout": "90s"}).pods
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["command"] == ["/bin/sh", "-c", "echo hi && sleep 1"]
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 90
    assert pod["metadata"]["namespace"] == "jobs"
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-0"]}]}
    ]
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpuyard",
        "app.kubernetes.io/component": "job",
        "gpuyard.io/job-id": "j-7f3a",
        "gpuyard.io/attempt": "2",
        "gpuyard.io/replica": "0",
        "gpuyard.io/tenant": "research",
    }
    assert "hostname" not in spec and "subdomain" not in spec
    env = env_of(pod)
    assert (env["GPUYARD_JOB_NAME"], env["GPUYARD_TENANT"], env["GPUYARD_NODE"]) == (
        "train",
        "research",
        "gpu-node-0",
    )
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["WORLD_SIZE"] == "1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "nvidia.com/gpu" not in limits_of(pod)


def test_list_command_is_executed_as_is():
    (pod,) = render({"command": ["python", "-c", "print(1)"]}).pods
    assert pod["spec"]["containers"][0]["command"] == ["python", "-c", "print(1)"]


def test_fractional_timeout_is_rounded_up():
    (pod,) = render({"command": "x", "timeout": 0.2}).pods
    assert pod["spec"]["activeDeadlineSeconds"] == 1


def test_cpu_memory_and_whole_gpus_are_requested_and_limited_equally():
    (pod,) = render({"command": "x", "resources": {"gpus": 4}}, gpus=4).pods
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["limits"] == {"cpu": "4000m", "memory": str(16 * 10**9), "nvidia.com/gpu": "4"}
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(pod)


def test_configurable_gpu_resource_name():
    config = KubernetesConfig(gpu_resource="amd.com/gpu")
    (pod,) = render({"command": "x", "resources": {"gpus": 2}}, config=config, gpus=2).pods
    assert limits_of(pod)["amd.com/gpu"] == "2"


def test_multi_replica_gets_headless_service_and_torchrun_env():
    manifests = render({"command": "torchrun t.py", "resources": {"gpus": 8}, "replicas": 3}, gpus=8)
    service = manifests.service
    assert service is not None and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    for key, value in service["spec"]["selector"].items():
        assert all(pod["metadata"]["labels"][key] == value for pod in manifests.pods)
    master = f"{manifests.pods[0]['metadata']['name']}.{service['metadata']['name']}.jobs.svc"
    for rank, pod in enumerate(manifests.pods):
        assert pod["spec"]["hostname"] == pod["metadata"]["name"]
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
        env = env_of(pod)
        assert env["MASTER_ADDR"] == master
        assert env["MASTER_PORT"] == "29500"
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "3")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
        assert (env["GPUYARD_JOB_ID"], env["GPUYARD_ATTEMPT"], env["GPUYARD_REPLICA"]) == (
            "j-7f3a",
            "2",
            str(rank),
        )
        assert pod["metadata"]["labels"]["gpuyard.io/replica"] == str(rank)
        node = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert node["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [f"gpu-node-{rank // 2}"]
    assert len({pod["metadata"]["name"] for pod in manifests.pods}) == 3


def test_job_env_is_kept_but_cannot_override_rank_variables():
    manifests = render({"command": "x", "env": {"WANDB_MODE": "offline", "RANK": "99"}, "replicas": 2})
    env = env_of(manifests.pods[1])
    assert env["WANDB_MODE"] == "offline"
    assert env["RANK"] == "1"
    names = [e["name"] for e in manifests.pods[1]["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names))


def test_hami_fraction_with_memory_maps_to_vgpu_memory_in_mib_and_cores_percent():
    (pod,) = render(
        {"command": "x", "resources": {"gpus": 0.25, "gpu_memory": "10GiB"}},
        fraction=0.25,
        memory=10 * 2**30,
    ).pods
    limits = limits_of(pod)
    assert limits["nvidia.com/gpu"] == "1"
    assert limits["nvidia.com/gpumem"] == str(10 * 1024)
    assert limits["nvidia.com/gpucores"] == "25"
    env = env_of(pod)
    assert env["GPUYARD_GPU_MEMORY_FRACTION"] == "0.25"
    assert env["GPUYARD_GPU_MEMORY_BYTES"] == str(10 * 2**30)


def test_hami_fraction_without_memory_uses_memory_percentage():
    config = KubernetesConfig(limit_gpu_cores=False)
    (pod,) = render({"command": "x", "resources": {"gpus": 0.333}}, config=config, fraction=0.333).pods
    limits = limits_of(pod)
    assert limits["nvidia.com/gpumem-percentage"] == "34"
    assert "nvidia.com/gpumem" not in limits and "nvidia.com/gpucores" not in limits
    assert "GPUYARD_GPU_MEMORY_BYTES" not in env_of(pod)


def test_shared_and_whole_fraction_modes():
    spec = {"command": "x", "resources": {"gpus": 0.5}}
    shared = KubernetesConfig(fractional_gpu_mode="shared", shared_gpu_resource="nvidia.com/gpu.shared")
    (pod,) = render(spec, config=shared, fraction=0.5).pods
    assert {k: v for k, v in limits_of(pod).items() if "/" in k} == {"nvidia.com/gpu.shared": "1"}
    assert env_of(pod)["GPUYARD_GPU_MEMORY_FRACTION"] == "0.5"
    (pod,) = render(spec, config=KubernetesConfig(fractional_gpu_mode="whole"), fraction=0.5).pods
    assert {k: v for k, v in limits_of(pod).items() if "/" in k} == {"nvidia.com/gpu": "1"}


def test_placement_memory_slice_wins_over_spec():
    (pod,) = render(
        {"command": "x", "resources": {"gpus": 0.5, "gpu_memory": "8GiB"}}, fraction=0.5, memory=6 * 2**30
    ).pods
    assert limits_of(pod)["nvidia.com/gpumem"] == str(6 * 1024)


def test_long_names_are_truncated_hashed_and_unique():
    long = "a" * 63
    first = render({"command": "x", "replicas": 2}, job_name=long)
    assert_valid(first)
    pod_name = first.pods[1]["metadata"]["name"]
    assert len(pod_name) <= 63 and pod_name.startswith("gy-aaaa") and pod_name.endswith("-a2-r1")
    other_attempt = attempt_names("gy", long, "j-7f3a", 3)
    other_job = attempt_names("gy", long, "j-7f3b", 2)
    assert len({first.names.base, other_attempt.base, other_job.base}) == 3
    assert len(attempt_names("gy", long, "j", 100).pod(1023)) <= 63


def test_awkward_names_and_ids_become_valid():
    names = attempt_names("gy", "9--Train_ME!!", "id", 1)
    assert DNS_1035.match(names.pod(0))
    assert attempt_names("gy", "___", "id", 1).base.startswith("gy-")
    assert label_value("j-1") == "j-1"
    weird = label_value("tenant/with:odd chars" + "x" * 80)
    assert LABEL_VALUE.match(weird) and len(weird) <= 63
    assert label_value("tenant/with:odd chars" + "x" * 80) == weird
    assert LABEL_VALUE.match(label_value("---"))


def test_long_job_id_is_hashed_in_labels_and_exact_in_annotations():
    job_id = "job-" + "0123456789abcdef" * 5
    job = JobSpec.model_validate({"command": "x"})
    manifests = build_job_manifests(
        job_id=job_id,
        attempt=1,
        job_name="n",
        tenant="t",
        spec=job,
        placements=placements(1),
        config=KubernetesConfig(),
    )
    pod = manifests.pods[0]
    assert pod["metadata"]["annotations"]["gpuyard.io/job-id"] == job_id
    assert pod["metadata"]["labels"]["gpuyard.io/job-id"] != job_id
    assert_valid(manifests)


def test_owner_target_owns_replica_zero():
    owner = OwnerTarget(api_version="apps/v1", kind="Deployment", name="gpuyard-executor", uid="abc")
    manifests = render({"command": "x", "replicas": 2}, config=KubernetesConfig(owner=owner))
    (reference,) = manifests.pods[0]["metadata"]["ownerReferences"]
    assert (reference["kind"], reference["name"], reference["uid"]) == (
        "Deployment",
        "gpuyard-executor",
        "abc",
    )
    assert "ownerReferences" not in manifests.pods[1]["metadata"]


def test_placements_must_cover_every_replica():
    job = JobSpec.model_validate({"command": "x", "replicas": 2})
    with pytest.raises(ValueError, match="placements"):
        build_job_manifests(
            job_id="j",
            attempt=1,
            job_name="n",
            tenant="t",
            spec=job,
            placements=placements(1),
            config=KubernetesConfig(),
        )


def test_rendering_is_pure():
    assert render({"command": "x", "replicas": 2}) == render({"command": "x", "replicas": 2})
