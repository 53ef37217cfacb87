"""What the executor announces with the Kubernetes backend: the cluster's GPU nodes, one `node.heartbeat`
each, read from the Node objects of the in-memory `FakeKubeApi`; and the local backend's single node, unchanged.

Limits of the fake (see `fake_kube_api.py`): nodes are the dicts the test adds, with only the fields the executor
reads (labels, `spec.unschedulable`, taints, the Ready condition, allocatable); nothing changes them but the
test (no node controller, no kubelet, no device plugin: "allocatable GPUs" are whatever the test writes), and
label selectors are `key=value` equalities only. The RBAC that lets the real client list nodes is checked in
tests/unit/project/test_deploy.py; the real client's request in test_kubernetes_client_api.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuyard.services.executor.kubernetes.api import KubeApiError
from gpuyard.services.executor.kubernetes.backend import KubernetesBackend
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.controller import KubernetesController
from gpuyard.services.executor.kubernetes.nodes import byte_count, cluster_inventory, cpu_cores, gpu_model
from gpuyard.services.scheduler.view import ClusterView, to_placement
from gpuyard.shared.contracts.events.jobs import JobPlaced
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.scheduling import SchedulerConfig, decide
from tests.unit.services.executor.fake_kube_api import FakeKubeApi

GIB, MIB = 2**30, 2**20
LIMITS = "enforced by Kubernetes (each pod's CPU and memory requests equal its limits)"
GFD = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "4",
    "topology.kubernetes.io/zone": "eu-west-1a",
    "node.kubernetes.io/instance-type": "p5.4xlarge",
}


def cluster(api: FakeKubeApi) -> None:
    """A GPU node with GPU feature discovery's labels, one without, a cordoned one, a NotReady one and a
    CPU-only one."""
    api.add_node(
        "gpu-a", labels=GFD, allocatable={"cpu": "7500m", "memory": "32920184Ki", "nvidia.com/gpu": "4"}
    )
    api.add_node("gpu-b", allocatable={"cpu": "16", "memory": "31Gi", "nvidia.com/gpu": "2"})
    api.add_node(
        "gpu-cordoned",
        labels=GFD,
        unschedulable=True,
        allocatable={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
    )
    api.add_node(
        "gpu-down",
        labels=GFD,
        ready="False",
        allocatable={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
    )
    api.add_node("cpu-only", allocatable={"cpu": "32", "memory": "128Gi"})


def k8s_backend(api, h, **config) -> KubernetesBackend:
    controller = KubernetesController(api, KubernetesConfig(namespace="jobs", **config))
    return KubernetesBackend(controller, data_dir=h.data_dir, poll_interval=3600, log_interval=0)


async def k8s_executor(h, api, config=None, **settings):
    backend = k8s_backend(api, h, **(config or {}))
    return await h.executor(backend=backend, executor_backend="kubernetes", **settings)


def expected_gpu_a(interval: float = 5.0) -> NodeHeartbeat:
    return NodeHeartbeat(
        node="gpu-a",
        gpus=[
            GpuInfo(index=i, uuid=f"K8S-gpu-a-{i}", model="H100", memory_bytes=81559 * MIB) for i in range(4)
        ],
        cpus=7.5,
        memory_bytes=32920184 * 1024,
        labels={
            "backend": "kubernetes",
            "kubernetes_node": "gpu-a",
            "zone": "eu-west-1a",
            "instance_type": "p5.4xlarge",
            "limits": LIMITS,
        },
        interval_seconds=interval,
    )


def heartbeats_published(h) -> list[NodeHeartbeat]:
    return [e.data for e in h.bus.published if isinstance(e.data, NodeHeartbeat)]


# ---------------------------------------------------------------- what is announced


async def test_the_kubernetes_executor_announces_each_ready_schedulable_gpu_node(h, api, caplog):
    cluster(api)
    ex = await k8s_executor(h, api, heartbeat_interval=7.0)
    with caplog.at_level(logging.INFO, logger="gpuyard.services.executor"):
        announced = await ex.nodes.announce_once()
    gpu_b = NodeHeartbeat(
        node="gpu-b",
        gpus=[GpuInfo(index=i, uuid=f"K8S-gpu-b-{i}", model="unknown", memory_bytes=0) for i in range(2)],
        cpus=16.0,
        memory_bytes=31 * GIB,
        labels={"backend": "kubernetes", "kubernetes_node": "gpu-b", "limits": LIMITS},
        interval_seconds=7.0,
    )
    assert announced == [expected_gpu_a(7.0), gpu_b]
    # the executor's own machine (node-a, with its 2 simulated GPUs) is not a Kubernetes node: not announced
    assert heartbeats_published(h) == announced
    assert ex.backend.skipped_nodes == {
        "gpu-cordoned": "cordoned (unschedulable)",
        "gpu-down": "not Ready (Ready: False)",
        "cpu-only": "no allocatable nvidia.com/gpu",
    }
    assert "not announcing Kubernetes node gpu-cordoned: cordoned (unschedulable)" in caplog.text
    assert "announcing 2 node(s) with 6 GPU(s): gpu-a, gpu-b" in caplog.text


async def test_every_round_lists_again_with_fresh_event_ids_and_drops_a_node_cordoned_meanwhile(h, api):
    cluster(api)
    ex = await k8s_executor(h, api)
    await ex.nodes.announce_once()
    api.nodes["gpu-a"]["spec"]["unschedulable"] = True  # kubectl cordon gpu-a
    assert [hb.node for hb in await ex.nodes.announce_once()] == ["gpu-b"]
    ids = [e.id for e in h.bus.published]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert [c for c in api.calls if c[0] == "list_nodes"] == [("list_nodes", "")] * 2


async def test_the_node_selector_setting_filters_the_listing(h, api):
    cluster(api)
    ex = await k8s_executor(h, api, config={"node_selector": "nvidia.com/gpu.present=true"})
    assert await ex.nodes.announce_once() == [expected_gpu_a()]
    assert ("list_nodes", "nvidia.com/gpu.present=true") in api.calls


async def test_defaults_for_nodes_without_gpu_feature_discovery(h, api):
    api.add_node("plain", allocatable={"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"})
    ex = await k8s_executor(h, api, config={"default_gpu_model": "A10G", "default_gpu_memory": "24GiB"})
    (hb,) = await ex.nodes.announce_once()
    assert hb.gpus == [GpuInfo(index=0, uuid="K8S-plain-0", model="A10G", memory_bytes=24 * GIB)]


async def test_the_local_backend_still_announces_only_its_own_node(h):
    ex = await h.executor()  # local backend, 2 simulated GPUs on node-a
    announced = await ex.nodes.announce_once()
    own = (
        ex.nodes.heartbeat()
    )  # (what the local backend adds to it: the job environments it offers and holds)
    assert [hb.model_copy(update={"pythons": [], "environments": []}) for hb in announced] == [own]
    assert [(hb.node, len(hb.gpus), hb.simulated) for hb in heartbeats_published(h)] == [("node-a", 2, True)]


# ---------------------------------------------------------------- the API failing


async def test_a_failing_listing_announces_nothing_logs_once_and_recovers(h, api, caplog):
    cluster(api)
    ex = await k8s_executor(h, api)
    api.nodes_error = KubeApiError(403, 'nodes is forbidden: cannot list resource "nodes"')
    with caplog.at_level(logging.INFO, logger="gpuyard.services.executor"):
        assert await ex.nodes.announce_once() == []
        assert await ex.nodes.announce_once() == []
        assert heartbeats_published(h) == []
        failures = [r for r in caplog.records if "cannot list the nodes" in r.getMessage()]
        assert len(failures) == 1 and failures[0].levelno == logging.WARNING
        assert "nodes is forbidden" in failures[0].getMessage()
        api.nodes_error = None
        assert [hb.node for hb in await ex.nodes.announce_once()] == ["gpu-a", "gpu-b"]
        assert "listing the nodes to announce works again" in caplog.text
        api.nodes_error = ConnectionRefusedError("connection refused")  # a second outage is logged again
        assert await ex.nodes.announce_once() == []
    assert len([r for r in caplog.records if "cannot list the nodes" in r.getMessage()]) == 2


async def test_the_heartbeat_loop_survives_an_unreachable_api_server(h, api):
    cluster(api)
    api.nodes_error = ConnectionRefusedError("connection refused")
    ex = await k8s_executor(h, api, heartbeat_interval=0.01)
    loop = asyncio.create_task(ex.nodes.run())
    try:
        await h.wait_for(lambda: len([c for c in api.calls if c[0] == "list_nodes"]) >= 3, what="3 rounds")
        assert not loop.done() and heartbeats_published(h) == []
        api.nodes_error = None
        await h.wait_for(lambda: heartbeats_published(h), what="heartbeats once the API is back")
        assert {hb.node for hb in heartbeats_published(h)} == {"gpu-a", "gpu-b"}
    finally:
        loop.cancel()


# ---------------------------------------------------------------- from a Node object to a heartbeat


@pytest.mark.parametrize(
    ("quantity", "cores"), [("7500m", 7.5), ("8", 8.0), ("250m", 0.25), ("0.5", 0.5), ("1k", 1000.0)]
)
def test_cpu_quantities(quantity, cores):
    assert cpu_cores(quantity) == cores


@pytest.mark.parametrize(
    ("quantity", "size"),
    [
        ("31Gi", 31 * GIB),
        ("32920184Ki", 32920184 * 1024),
        ("128G", 128 * 10**9),
        ("1e9", 10**9),
        ("1.5Gi", 3 * GIB // 2),
        ("512", 512),
    ],
)
def test_memory_quantities(quantity, size):
    assert byte_count(quantity) == size


def test_an_unreadable_quantity_skips_the_node_with_the_reason():
    api = FakeKubeApi()
    api.add_node("odd", allocatable={"cpu": "lots", "memory": "8Gi", "nvidia.com/gpu": "1"})
    inventory = cluster_inventory(api.nodes.values(), KubernetesConfig(), interval_seconds=5)
    assert inventory.heartbeats == []
    assert inventory.skipped["odd"].startswith("unreadable allocatable resources")


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("NVIDIA-A100-SXM4-40GB-SHARED", "A100"),
        ("Tesla-V100-SXM2-16GB", "V100"),
        ("NVIDIA-L4", "L4"),
        (None, "unknown"),
    ],
)
def test_gpu_models_are_named_as_nvml_names_them(product, model):
    assert gpu_model(product, "unknown") == model


def inventory_of(api: FakeKubeApi, **config):
    return cluster_inventory(api.nodes.values(), KubernetesConfig(**config), interval_seconds=5)


def test_shared_gpus_count_once():
    """Time-slicing or MPS sharing by the NVIDIA device plugin multiplies the allocatable count by GFD's
    `nvidia.com/gpu.replicas`; HAMi splits each GPU without that label, but GFD's `gpu.count` caps it."""
    api = FakeKubeApi()
    api.add_node(
        "sliced",
        labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2"},
        allocatable={"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "8"},
    )
    api.add_node(
        "hami",
        labels={"nvidia.com/gpu.count": "2"},
        allocatable={"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "20"},
    )
    api.add_node(
        "one-unhealthy",
        labels={"nvidia.com/gpu.count": "8"},
        allocatable={"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "7"},
    )
    assert {hb.node: len(hb.gpus) for hb in inventory_of(api).heartbeats} == {
        "sliced": 2,
        "hami": 2,
        "one-unhealthy": 7,
    }


def test_taints_the_job_pods_do_not_tolerate_keep_a_node_out():
    api = FakeKubeApi()
    gpu = {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "1"}
    api.add_node("tainted", allocatable=gpu, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    api.add_node(
        "soft", allocatable=gpu, taints=[{"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}]
    )
    api.add_node(
        "draining", allocatable=gpu, taints=[{"key": "drain", "value": "now", "effect": "NoExecute"}]
    )
    plain = inventory_of(api)
    assert [hb.node for hb in plain.heartbeats] == ["soft"]
    assert plain.skipped["tainted"].startswith("tainted nvidia.com/gpu:NoSchedule, which job pods do not")
    assert plain.skipped["draining"].startswith("tainted drain=now:NoExecute")
    tolerant = inventory_of(
        api,
        tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "drain", "operator": "Equal", "value": "now"},
        ],
    )
    assert [hb.node for hb in tolerant.heartbeats] == ["tainted", "soft", "draining"]
    wrong_value = inventory_of(api, tolerations=[{"key": "drain", "value": "later"}])
    assert "draining" in wrong_value.skipped


def test_the_announced_name_is_the_label_pods_are_pinned_by():
    api = FakeKubeApi()
    gpu = {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "1"}
    api.add_node("ip-10-0-0-1.internal", labels={"gpuyard.io/node": "trainer-1"}, allocatable=gpu)
    api.add_node("ip-10-0-0-2.internal", allocatable=gpu)
    api.add_node("ip-10-0-0-3.internal", labels={"gpuyard.io/node": "trainer-1"}, allocatable=gpu)
    inventory = inventory_of(api, node_label="gpuyard.io/node")
    (hb,) = inventory.heartbeats
    assert hb.node == "trainer-1" and hb.labels["kubernetes_node"] == "ip-10-0-0-1.internal"
    assert inventory.skipped == {
        "ip-10-0-0-2.internal": "no label gpuyard.io/node: job pods could not be pinned to it",
        "ip-10-0-0-3.internal": "gpuyard.io/node=trainer-1 is also the label of node ip-10-0-0-1.internal",
    }


def test_a_node_without_a_ready_condition_is_not_announced():
    api = FakeKubeApi()
    api.add_node("new", ready="", allocatable={"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "1"})
    assert inventory_of(api).skipped == {"new": "not Ready (Ready: unknown (no Ready condition))"}


# ---------------------------------------------------------------- announced node → placement → pod


async def test_the_scheduler_places_on_an_announced_node_and_the_pod_is_pinned_to_it(h, api):
    cluster(api)
    ex = await k8s_executor(h, api)
    view = ClusterView()
    for hb in await ex.nodes.announce_once():
        view.observe_node(hb)
    job = await h.submit(command="python train.py", resources={"gpus": 2, "gpu_model": "H100"})
    view.put_job(await h.view(job))
    (placement,) = decide(
        view.held.index(), view.held.allocations(), view.queue(), SchedulerConfig()
    ).placements
    placements = [to_placement(r, view.nodes[r.node].heartbeat) for r in placement.replicas]
    assert [p.node for p in placements] == ["gpu-a"]  # the only H100 node the scheduler knows of
    placed = JobPlaced(job_id=job, attempt=1, placements=placements)
    await h.ledger.append(job, placed)
    await h.deliver(ex, placed)
    (pod,) = api.pods.values()
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a"]}]}
    ]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
