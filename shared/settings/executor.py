"""The executor's settings: its node, its backend (local processes or Kubernetes), job users, logs."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from gpuyard.shared.settings.common import Duration, Size, written
from gpuyard.shared.settings.environments import EnvironmentSettings
from gpuyard.shared.settings.gateway import GatewaySettings
from gpuyard.shared.settings.kubernetes import KubernetesConfig
from gpuyard.shared.settings.slurm import SlurmConfig


class ExecutorSettings(EnvironmentSettings, GatewaySettings):
    """The executor. Its Kubernetes backend's settings are `kubernetes`: GPUYARD_KUBERNETES_<FIELD>."""

    model_config = SettingsConfigDict(env_nested_delimiter="_", env_nested_max_split=1)
    """GPUYARD_KUBERNETES_IMAGE_PULL_POLICY is kubernetes.image_pull_policy: split once, after KUBERNETES."""

    node_name: str = Field(
        default_factory=socket.gethostname,
        description="The node this executor announces (default: hostname).",
    )
    simulate_gpus: int = Field(0, description="Announce N virtual GPUs when NVML finds none.")
    simulated_gpu_model: str = Field("SIM-GPU", description="Model name of the simulated GPUs.")
    simulated_gpu_memory: str = Field("16GiB", description="Memory of each simulated GPU.")
    executor_backend: Literal["local", "kubernetes", "slurm"] = Field(
        "local",
        description="local (process groups on this node), kubernetes (one pod per replica) or slurm (one "
        "batch job per replica).",
    )
    advertise_address: str = Field(
        "", description="This node's address for MASTER_ADDR of multi-node jobs; default: the hostname's."
    )
    heartbeat_interval: float = Field(5.0, description="Seconds between node heartbeats.")
    grace_seconds: float = Field(10.0, description="SIGTERM-to-SIGKILL grace when stopping a job.")
    retry_backoff: float = Field(5.0, description="Seconds before the first retry; doubles each attempt.")
    event_concurrency: int = Field(
        64, description="Job events handled at once (events of one job always in order)."
    )
    executor_workers: int = Field(
        1, ge=1, le=64, description="Executor processes sharing this node's placements (local backend)."
    )
    executor_worker: int = Field(
        0, ge=0, description="Which of them this one is, from 0 (0 announces the node)."
    )
    log_max_bytes: Size = Field(
        written("64MiB"), description="Size of a replica's log file before it is rotated (0: never rotated)."
    )
    log_backups: int = Field(4, ge=0, description="Rotated log files kept per replica and attempt.")
    tenant_log_budget: Size = Field(
        written("2GiB"),
        ge=0,
        description="Most node log the running replicas of one tenant hold on this node together (their log "
        "files, rotated ones included; the node's executor processes share it equally): beyond it their output "
        "is dropped, after a line saying so, until one of them ends (0: no limit).",
    )
    replica_start: Literal["helper", "fork"] = Field(
        "helper",
        description="How the reaper starts a replica: helper (a small C library built at the start with the "
        "node's C compiler; without one, fork) or fork (its child takes the steps in Python: ~1.4 ms more CPU).",
    )
    cgroup_limits: bool = Field(True, description="Enforce cpus and memory through cgroup v2 where writable.")
    cgroup_root: Path = Field(Path("/sys/fs/cgroup"), description="Mount point of the cgroup v2 hierarchy.")
    cgroup_parent: str = Field(
        "", description="Cgroup (under the root) to create job cgroups in; default: the executor's own."
    )
    gpu_memory_policy: Literal["warn", "stop", "off"] = Field(
        "warn", description="A job over its GPU memory slice: warn (alert) or stop it after the grace."
    )
    gpu_memory_grace: float = Field(30.0, ge=0, description="Seconds over its slice before a job is stopped.")
    gpu_memory_interval: float = Field(5.0, gt=0, description="Seconds between GPU memory readings.")
    gpu_memory_slack: Size = Field(
        written("512MiB"),
        description="Tolerated use above a slice: NVML counts the CUDA context (~0.5 GiB) too.",
    )
    mps: Literal["auto", "on", "off"] = Field(
        "auto", description="Give fractional jobs CUDA MPS limits: auto = when an MPS daemon runs here."
    )
    api_url: str = Field(
        "http://127.0.0.1:8080",
        description="URL of the submit API as jobs reach it: given to each replica as GPUYARD_SERVER, with "
        "its publish token (`gpuyard up` sets it).",
    )
    publish_token_lifetime: Duration = Field(
        written("7d"),
        description="How long a job's publish token is valid at most (`7d`, `12h`): it is refused sooner, once "
        "the attempt that got it has ended.",
    )
    kubeconfig: str = Field(
        "",
        description="Kubernetes backend: kubeconfig file outside a cluster (default: in-cluster credentials).",
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig, description="The Kubernetes backend's settings."
    )
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="The Slurm backend's settings.")

    @model_validator(mode="after")
    def _one_worker_index_per_process(self) -> ExecutorSettings:
        if self.executor_worker >= self.executor_workers:
            raise ValueError(
                f"executor_worker {self.executor_worker} is not below executor_workers {self.executor_workers}"
            )
        if self.executor_workers > 1 and self.executor_backend != "local":
            raise ValueError("several executor workers per node need the local backend")
        return self
