"""CPU, memory and GPU requests of one replica's container.

Requests equal limits (Guaranteed QoS: training pods are the last the kubelet evicts). Extended resources
such as `nvidia.com/gpu` cannot be overcommitted: Kubernetes requires their request to equal their limit.

Which physical GPUs a pod gets is the device plugin's choice; the GPU indices of the placement are not
enforced, only their number and share.
"""

from __future__ import annotations

import math

from gpuyard.services.executor.kubernetes.config import FractionalGpuMode, KubernetesConfig
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.jobspec import Resources

MIB = 2**20


def cpu_quantity(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def memory_quantity(memory_bytes: int) -> str:
    return str(max(1, int(memory_bytes)))


def gpu_memory_slice(resources: Resources, placement: ReplicaPlacement) -> int | None:
    """Bytes of GPU memory a fractional replica may use: the placement's slice, else the spec's, else None."""
    if not resources.is_fractional:
        return None
    slices = [g.memory_bytes for g in placement.gpus if g.memory_bytes]
    if slices:
        return slices[0]
    return resources.gpu_memory


def gpu_limits(resources: Resources, placement: ReplicaPlacement, config: KubernetesConfig) -> dict[str, str]:
    if resources.whole_gpus:
        return {config.gpu_resource: str(resources.whole_gpus)}
    if not resources.is_fractional:
        return {}
    if config.fractional_gpu_mode is FractionalGpuMode.WHOLE:
        return {config.gpu_resource: "1"}
    if config.fractional_gpu_mode is FractionalGpuMode.SHARED:
        return {config.shared_gpu_resource: "1"}
    percent = min(100, max(1, math.ceil(resources.gpus * 100)))
    limits = {config.gpu_resource: "1"}
    memory = gpu_memory_slice(resources, placement)
    if memory:
        limits[config.gpu_memory_resource] = str(math.ceil(memory / MIB))
    else:
        limits[config.gpu_memory_percentage_resource] = str(percent)
    if config.limit_gpu_cores:
        limits[config.gpu_cores_resource] = str(percent)
    return limits


def container_resources(
    resources: Resources, placement: ReplicaPlacement, config: KubernetesConfig
) -> dict[str, dict[str, str]]:
    cpus = placement.cpus or resources.cpus
    memory = placement.memory_bytes or resources.memory
    amounts = {"cpu": cpu_quantity(cpus), "memory": memory_quantity(memory)}
    amounts.update(gpu_limits(resources, placement, config))
    return {"requests": dict(amounts), "limits": dict(amounts)}
