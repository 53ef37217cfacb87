"""The cluster's GPU nodes as the scheduler sees them: one `NodeHeartbeat` per Kubernetes node that can take
GPUYARD's job pods. Pure: Node objects (API-shaped dicts) in, heartbeats and reasons out.

A node is announced when it is Ready, not cordoned, has allocatable GPUs (`KubernetesConfig.gpu_resource`),
carries the label the job pods are pinned by (`KubernetesConfig.node_label`, whose value is the announced
node name, so that a placement on it becomes node affinity to exactly that node) and has no NoSchedule or
NoExecute taint the job pods do not tolerate (`KubernetesConfig.tolerations`). Every other node is skipped,
with the reason in plain words. Nodes without GPUs are not announced: CPU-only jobs run on GPU nodes.

What a heartbeat says, read from the Node:

- GPUs: as many as allocatable, divided by `nvidia.com/gpu.replicas` when the NVIDIA device plugin shares
  each GPU as several (time-slicing, MPS) and at most `nvidia.com/gpu.count` (both labels of GPU feature
  discovery, GFD); indices 0..n-1, the model from GFD's `nvidia.com/gpu.product` (shortened as NVML names
  are, "NVIDIA-H100-80GB-HBM3" → "H100"), the memory from GFD's `nvidia.com/gpu.memory` (MiB). Without
  GFD: `default_gpu_model`, `default_gpu_memory`. The uuids are placeholders (`K8S-<node>-<index>`): which
  physical GPU a pod gets is the device plugin's choice.
- cpus and memory: the node's allocatable (not minus what other pods request).
- labels: `backend`, `kubernetes_node` (the Node's name), `zone` and `instance_type` when the node has the
  well-known labels, plus what the caller adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils import parse_quantity

from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.gpus.inventory import short_model

MIB = 2**20
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_REPLICAS = "nvidia.com/gpu.replicas"
ZONE = "topology.kubernetes.io/zone"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class ClusterInventory:
    heartbeats: list[NodeHeartbeat] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Kubernetes node name → why it is not announced."""


class NotAnnounced(Exception):
    """The node cannot take GPUYARD's pods (or has no GPU); the message says why."""


def cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity as cores: "7500m" → 7.5, "8" → 8.0."""
    return float(parse_quantity(quantity))


def byte_count(quantity: str) -> int:
    """A Kubernetes memory quantity in bytes: "31Gi", "32920184Ki", "128G", "1e9"."""
    return int(parse_quantity(quantity))


def _count(quantity: str) -> int:
    return int(parse_quantity(quantity))


def gpu_model(product: str | None, default: str) -> str:
    """GFD's product label ("NVIDIA-A100-SXM4-40GB", "Tesla-V100-SXM2-16GB-SHARED") as the short model name
    the local backend announces from NVML ("A100", "V100")."""
    return short_model(product.replace("-", " ").replace("_", " ")) if product else default


def tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one of `tolerations` tolerates `taint`, by Kubernetes' matching rules."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _ready(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") or "Unknown"
    return "unknown (no Ready condition)"


def node_heartbeat(
    node: Mapping[str, Any],
    config: KubernetesConfig,
    *,
    interval_seconds: float,
    labels: Mapping[str, str] | None = None,
) -> NodeHeartbeat:
    """The heartbeat of one Kubernetes node. Raises NotAnnounced with the reason when it is not announced."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    node_labels: Mapping[str, str] = meta.get("labels") or {}
    if spec.get("unschedulable"):
        raise NotAnnounced("cordoned (unschedulable)")
    ready = _ready(status)
    if ready != "True":
        raise NotAnnounced(f"not Ready (Ready: {ready})")
    for taint in spec.get("taints") or []:
        if taint.get("effect") in BLOCKING_TAINT_EFFECTS and not tolerated(taint, config.tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            raise NotAnnounced(
                f"tainted {taint.get('key')}{value}:{taint.get('effect')}, which job pods do not tolerate "
                "(GPUYARD_KUBERNETES_TOLERATIONS)"
            )
    name = node_labels.get(config.node_label)
    if not name:
        raise NotAnnounced(f"no label {config.node_label}: job pods could not be pinned to it")
    allocatable: Mapping[str, str] = status.get("allocatable") or {}
    try:
        gpus = _count(allocatable.get(config.gpu_resource) or "0")
        cpus = cpu_cores(allocatable.get("cpu") or "0")
        memory = byte_count(allocatable.get("memory") or "0")
    except (ValueError, ArithmeticError) as exc:
        raise NotAnnounced(f"unreadable allocatable resources {dict(allocatable)}: {exc}") from exc
    replicas = _label_int(node_labels, GFD_REPLICAS)
    if replicas and replicas > 1:
        gpus //= replicas
    physical = _label_int(node_labels, GFD_COUNT)
    if physical is not None:
        gpus = min(gpus, physical)
    if gpus <= 0:
        raise NotAnnounced(f"no allocatable {config.gpu_resource}")
    model = gpu_model(node_labels.get(GFD_PRODUCT), config.default_gpu_model)
    memory_mib = _label_int(node_labels, GFD_MEMORY)
    gpu_memory = memory_mib * MIB if memory_mib else config.default_gpu_memory
    extra = {"zone": node_labels.get(ZONE), "instance_type": node_labels.get(INSTANCE_TYPE)}
    return NodeHeartbeat(
        node=name,
        gpus=[
            GpuInfo(index=i, uuid=f"K8S-{name}-{i}", model=model, memory_bytes=gpu_memory)
            for i in range(gpus)
        ],
        cpus=cpus,
        memory_bytes=memory,
        labels={
            "backend": "kubernetes",
            "kubernetes_node": meta.get("name", name),
            **{k: v for k, v in extra.items() if v},
            **(labels or {}),
        },
        interval_seconds=interval_seconds,
    )


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, TypeError, ValueError):
        return None


def cluster_inventory(
    nodes: Iterable[Mapping[str, Any]],
    config: KubernetesConfig,
    *,
    interval_seconds: float,
    labels: Mapping[str, str] | None = None,
) -> ClusterInventory:
    """One heartbeat per announced node, in the order listed; two nodes with the same `node_label` value
    cannot both be pinned to, so the second is skipped."""
    inventory = ClusterInventory()
    owners: dict[str, str] = {}
    for node in nodes:
        kube_name = (node.get("metadata") or {}).get("name", "?")
        try:
            heartbeat = node_heartbeat(node, config, interval_seconds=interval_seconds, labels=labels)
        except NotAnnounced as why:
            inventory.skipped[kube_name] = str(why)
            continue
        if heartbeat.node in owners:
            inventory.skipped[kube_name] = (
                f"{config.node_label}={heartbeat.node} is also the label of node {owners[heartbeat.node]}"
            )
            continue
        owners[heartbeat.node] = kube_name
        inventory.heartbeats.append(heartbeat)
    return inventory
