"""Settings of the executor's Kubernetes backend: how it polls and shapes the objects it creates.

A plain model, nested in `ExecutorSettings.kubernetes`: each field is read from GPUYARD_KUBERNETES_<FIELD>
(or the flag --kubernetes.<field>). Lists and mappings (extra_labels, tolerations, image_pull_secrets,
owner) are read as JSON, e.g. GPUYARD_KUBERNETES_EXTRA_LABELS='{"team": "research"}'.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuyard.shared.contracts.units import parse_size


class FractionalGpuMode(StrEnum):
    """How a fractional GPU (0 < gpus < 1) is asked of Kubernetes."""

    HAMI = "hami"
    """HAMi device plugin: one vGPU (`gpu_resource: 1`), its memory slice (`gpu_memory_resource`, MiB, or
    `gpu_memory_percentage_resource` when the job gave no memory size) and its compute share
    (`gpu_cores_resource`, percent of the SMs). The plugin enforces both limits inside the container."""
    SHARED = "shared"
    """One unit of `shared_gpu_resource`, e.g. `nvidia.com/gpu.shared` of the NVIDIA plugin's time-slicing
    or MPS sharing. Nothing is enforced: the job reads GPUYARD_GPU_MEMORY_FRACTION and limits itself."""
    WHOLE = "whole"
    """No sharing plugin: a fractional job gets a whole GPU."""


class OwnerTarget(BaseModel):
    """An object that owns every job's first pod, e.g. the executor's Deployment: deleting it deletes the jobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    api_version: str = Field(..., description="e.g. apps/v1")
    kind: str = Field(..., description="e.g. Deployment")
    name: str = Field(..., description="The owner's name.")
    uid: str = Field(..., description="The owner's uid (metadata.uid).")


class KubernetesConfig(BaseModel):
    """The Kubernetes backend (GPUYARD_EXECUTOR_BACKEND=kubernetes)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    poll_interval: float = Field(2.0, gt=0, description="Seconds between polls of the job pods.")
    log_interval: float = Field(
        5.0, gt=0, description="Seconds between copies of a running pod's log into the data directory."
    )
    namespace: str = Field("default", description="Namespace of the job pods and services.")
    image: str = Field(
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", description="Image the job commands run in."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy of the job containers."
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list, description='Secrets to pull the job image with, a JSON list: `["regcred"]`.'
    )
    service_account: str | None = Field(
        None, description="Service account of job pods; its token is not mounted."
    )
    gpu_resource: str = Field("nvidia.com/gpu", description="Extended resource of one whole GPU.")
    fractional_gpu_mode: FractionalGpuMode = Field(
        FractionalGpuMode.HAMI,
        description="How a fractional GPU is asked of Kubernetes: hami, shared (one slot of "
        "shared_gpu_resource, not enforced) or whole (a whole GPU).",
    )
    gpu_memory_resource: str = Field("nvidia.com/gpumem", description="HAMi: memory of a vGPU, in MiB.")
    gpu_memory_percentage_resource: str = Field(
        "nvidia.com/gpumem-percentage", description="HAMi: memory of a vGPU as a percentage of the GPU."
    )
    gpu_cores_resource: str = Field("nvidia.com/gpucores", description="HAMi: compute share, percent.")
    limit_gpu_cores: bool = Field(True, description="HAMi: also cap the compute share at the fraction.")
    shared_gpu_resource: str = Field("nvidia.com/gpu.shared", description="SHARED mode: one shared slot.")
    node_label: str = Field(
        "kubernetes.io/hostname", description="Node label whose value is the placement's node name."
    )
    master_port: int = Field(29500, ge=1, le=65535, description="MASTER_PORT of distributed jobs.")
    extra_labels: dict[str, str] = Field(
        default_factory=dict, description='Labels added to every job object, a JSON object: `{"team": "ml"}`.'
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Tolerations added to every job pod (a JSON list), e.g. for tainted GPU nodes.",
    )
    owner: OwnerTarget | None = Field(
        None,
        description="Object that owns every job's first pod (e.g. the executor's Deployment), a JSON object "
        "with api_version, kind, name and uid; deleting it deletes the jobs.",
    )
    shm_size: int | None = Field(
        None,
        description="Bytes of a memory-backed /dev/shm (PyTorch data loaders, NCCL); empty: the runtime's.",
    )
    termination_grace_seconds: int = Field(
        30, ge=0, description="terminationGracePeriodSeconds of the job pods."
    )
    start_timeout_seconds: float = Field(
        600, gt=0, description="A pod unschedulable or failing to pull its image this long fails to start."
    )
    log_tail_lines: int = Field(50, ge=0, description="Log lines kept with a failed replica's outcome.")
    name_prefix: str = Field(
        "gy",
        pattern=r"^[a-z][a-z0-9]{0,7}$",
        description="Prefix of the job objects' names: a lowercase letter, then up to 7 letters or digits.",
    )
    create_concurrency: int = Field(16, ge=1, description="Pods created at once by one launch.")
    node_selector: str = Field(
        "",
        description="Label selector of the nodes announced to the scheduler (e.g. "
        "`nvidia.com/gpu.present=true`); empty: every node with allocatable GPUs.",
    )
    default_gpu_model: str = Field(
        "unknown", description="GPU model of a node without the `nvidia.com/gpu.product` label."
    )
    default_gpu_memory: int = Field(
        0,
        ge=0,
        description="GPU memory (bytes, or a size such as `80GiB`) of a node without the "
        "`nvidia.com/gpu.memory` label; 0: unknown.",
    )

    volume_storage_class: str | None = Field(
        None,
        description="storageClassName of the volumes' claims (ReadWriteMany); empty: the cluster's default class "
        "(with the nfs settings: no class, the claims bind to their own PersistentVolumes).",
    )
    volume_nfs_server: str | None = Field(
        None,
        description="NFS server of the export mounted as the submit service's storage root: each volume becomes a "
        "PersistentVolume of its folder there, and job pods get their checkpoint and output folders from it. "
        "Set with volume_nfs_path.",
    )
    volume_nfs_path: str | None = Field(
        None,
        pattern=r"^(/.*)?$",
        description="Path of that export on the server (absolute). Set with volume_nfs_server.",
    )
    platform_image: str = Field(
        "ghcr.io/gpuyard/gpuyard:0.1.0",
        description="The platform's own image (with the `s3` extra), run in each job pod as the init container "
        "that copies the job's volumes from the object store (GPUYARD_VOLUME_STORE).",
    )
    volume_store_secret: str | None = Field(
        None,
        description="Secret whose keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL…) are the "
        "environment of that init container; empty: none (the image's or the node's own credentials).",
    )
    volume_working_dir: str = Field(
        "/workspace",
        pattern=r"^/",
        description="Working directory of a job pod that mounts a volume at a relative path and names no "
        "absolute working_dir (a relative working_dir is under it).",
    )

    @field_validator("default_gpu_memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _nfs_together(self) -> KubernetesConfig:
        if bool(self.volume_nfs_server) != bool(self.volume_nfs_path):
            raise ValueError("volume_nfs_server and volume_nfs_path are set together, or neither")
        return self

    @property
    def nfs_export(self) -> tuple[str, str] | None:
        """(server, path) of the storage root's NFS export, None when not set."""
        if self.volume_nfs_server and self.volume_nfs_path:
            return self.volume_nfs_server, self.volume_nfs_path
        return None
