"""Environment of one replica: the job's own variables, then GPUYARD's (its volumes' and storage folders'
included: `podvolumes.py`) and torchrun's (which win).

The same names as the local backend's (services/executor/jobenv.py) except for the GPU pinning
(CUDA_VISIBLE_DEVICES is the device plugin's business here) and LOCAL_RANK / LOCAL_WORLD_SIZE:
each replica is one pod, so from PyTorch's point of view every replica is its own node: the device plugin
shows the pod only its own GPUs (they are cuda:0…), hence LOCAL_RANK=0 and LOCAL_WORLD_SIZE=1 while RANK and
WORLD_SIZE count replicas. MASTER_ADDR is replica 0's DNS name through the attempt's headless Service.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuyard.services.executor.jobenv import identity_env, notebook_env, torchrun_env
from gpuyard.services.executor.kubernetes.names import AttemptNames
from gpuyard.services.executor.kubernetes.resources import gpu_memory_slice
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec

LOCALHOST = "127.0.0.1"


def master_address(names: AttemptNames, namespace: str, replicas: int) -> str:
    if replicas == 1:
        return LOCALHOST
    return f"{names.pod(0)}.{names.service}.{namespace}.svc"


def replica_env(
    *,
    job_id: str,
    job_name: str,
    tenant: str,
    attempt: int,
    spec: JobSpec,
    placement: ReplicaPlacement,
    names: AttemptNames,
    namespace: str,
    master_port: int,
    mounts: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """`mounts`: the variables of what the pod mounts (GPUYARD_VOLUME_<NAME>, GPUYARD_CHECKPOINT_DIR…)."""
    values: dict[str, str] = dict(spec.env)
    values.update(
        identity_env(
            job_id=job_id,
            job_name=job_name,
            tenant=tenant,
            attempt=attempt,
            replica=placement.replica,
            node=placement.node,
        )
    )
    values.update(mounts or {})
    values.update(notebook_env(spec, job_id, attempt))  # (JupyterLab listens on the pod's loopback)
    values.update(
        torchrun_env(
            rank=placement.replica,
            world_size=spec.replicas,
            local_rank=0,  # one replica per pod (see above)
            local_world_size=1,
            master_addr=master_address(names, namespace, spec.replicas),
            master_port=master_port,
        )
    )
    if spec.resources.is_fractional:
        values["GPUYARD_GPU_MEMORY_FRACTION"] = f"{spec.resources.gpus:g}"
        memory = gpu_memory_slice(spec.resources, placement)
        if memory:
            values["GPUYARD_GPU_MEMORY_BYTES"] = str(memory)
    elif spec.resources.gpus == 0:
        # With the NVIDIA runtime as the node's default, a pod asking for no GPU would otherwise see them all.
        values.setdefault("NVIDIA_VISIBLE_DEVICES", "void")
    return [{"name": name, "value": value} for name, value in values.items()]
