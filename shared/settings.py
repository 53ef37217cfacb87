"""Settings of every service, read from GPUYARD_* environment variables (and CLI flags mapped onto them).

Nothing else in the project reads os.environ for configuration.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.units import parse_size


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "gpuyard"


def _tenant_numbers(value: object) -> object:
    """'vision=8,nlp=4' (or a JSON object, or a dict) -> {'vision': 8.0, 'nlp': 4.0}."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("{"):
        return json.loads(text)
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, number = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"expected tenant=number, got {item!r}")
        pairs[name.strip()] = number.strip()
    return pairs


TenantNumbers = Annotated[dict[str, float], NoDecode, BeforeValidator(_tenant_numbers)]


class CommonSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix="GPUYARD_", extra="ignore")

    nats_url: str = Field("nats://127.0.0.1:4222", description="One or more NATS URLs, comma-separated.")
    store: str = Field("", description="sqlite:///path/events.db (default: in the data dir) or mongodb://…")
    data_dir: Path = Field(default_factory=default_data_dir)
    instance: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    health_host: str = "127.0.0.1"
    health_port: int = Field(0, description="Port of /healthz and /readyz; 0 picks a free one.")
    log_level: str = "INFO"
    max_deliver: int = Field(
        5, description="Deliveries of one event before it goes to the dead-letter stream."
    )
    stream_replicas: int = Field(
        1, ge=1, le=5, description="Replicas of each JetStream stream and KV bucket: 3 on a 3-server cluster."
    )

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.data_dir / 'events.db'}"

    @property
    def nats_servers(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]


class SubmitSettings(CommonSettings):
    submit_host: str = "127.0.0.1"
    submit_port: int = 8080
    tokens_file: Path | None = Field(
        None, description="JSON/YAML file of tokens: {token: {tenant, user, admin}}."
    )
    tokens: str = Field("", description="Inline tokens: 'token=tenant[:user][:admin],…'.")
    max_body_bytes: int = 1 << 20


class SchedulerSettings(CommonSettings):
    policy: str = Field("gpuyard", description="Placement policy: gpuyard, fgd, bestfit or firstfit.")
    cycle_interval: float = Field(
        1.0, description="Seconds between timer-driven cycles (events also trigger one)."
    )
    node_timeout: float = Field(
        30.0, description="Seconds without a heartbeat before a node is declared lost."
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, 'vision=8,nlp=4'; empty: no quotas (one shared pool).",
    )
    tenant_weights: TenantNumbers = Field(
        default_factory=dict, description="Fair-share weight per tenant, 'vision=2'; default 1."
    )
    user_gpu_cap: TenantNumbers = Field(
        default_factory=dict,
        description="Most GPUs one user of a tenant may hold, 'vision=4'; '*=4' for every tenant.",
    )
    fair_share: bool = Field(True, description="Fair share across tenants inside a priority class.")
    borrowing: bool = Field(True, description="Tenants may borrow idle GPUs above their quota.")
    preemption: bool = Field(True, description="Higher priority and quota reclaims may preempt.")
    min_runtime_before_preemption: float = Field(
        300.0, description="Seconds a job runs before it may be preempted (no thrashing)."
    )
    preemption_grace: float = Field(
        30.0, description="Seconds a preempted job gets between SIGTERM and SIGKILL."
    )
    backfill: str = Field("easy", description="easy, greedy or off.")
    pending_after: float = Field(
        5.0,
        description="Seconds a job that only waits its turn for busy resources waits before the scheduler "
        "stores why (a burst of jobs placed within it writes no reasons); 0: at once.",
    )
    lease_ttl: float = Field(
        10.0, description="Seconds a leader's lease lasts; another replica takes over after it lapses."
    )
    resync_interval: float = Field(
        30.0, description="Seconds between full re-reads of the live jobs from the event store."
    )


Size = Annotated[int, BeforeValidator(parse_size)]  # '64MiB', '2GB' or a number of bytes


class ExecutorSettings(CommonSettings):
    node_name: str = Field(default_factory=socket.gethostname)
    simulate_gpus: int = Field(0, description="Announce N virtual GPUs when NVML finds none.")
    simulated_gpu_model: str = "SIM-GPU"
    simulated_gpu_memory: str = "16GiB"
    executor_backend: Literal["local", "kubernetes"] = Field(
        "local", description="local (process groups on this node) or kubernetes (one pod per replica)."
    )
    advertise_address: str = Field(
        "", description="This node's address for MASTER_ADDR of multi-node jobs; default: the hostname's."
    )
    heartbeat_interval: float = 5.0
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
        "64MiB", description="Size of a replica's log file before it is rotated (0: never rotated)."
    )
    log_backups: int = Field(4, ge=0, description="Rotated log files kept per replica and attempt.")
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
        "512MiB", description="Tolerated use above a slice: NVML counts the CUDA context (~0.5 GiB) too."
    )
    mps: Literal["auto", "on", "off"] = Field(
        "auto", description="Give fractional jobs CUDA MPS limits: auto = when an MPS daemon runs here."
    )
    kubeconfig: str = Field("", description="Kubernetes backend: kubeconfig file outside a cluster.")
    kubernetes_poll_interval: float = Field(
        2.0, gt=0, description="Kubernetes backend: seconds between polls."
    )
    kubernetes_log_interval: float = Field(
        5.0, gt=0, description="Kubernetes backend: seconds between copies of a running pod's log."
    )

    @model_validator(mode="after")
    def _one_worker_index_per_process(self) -> ExecutorSettings:
        if self.executor_worker >= self.executor_workers:
            raise ValueError(
                f"executor_worker {self.executor_worker} is not below executor_workers {self.executor_workers}"
            )
        if self.executor_workers > 1 and self.executor_backend != "local":
            raise ValueError("several executor workers per node need the local backend")
        return self


class MonitorSettings(CommonSettings):
    node_name: str = Field(default_factory=socket.gethostname)
    simulate_gpus: int = 0
    sample_interval: float = 5.0
    metrics_port: int = 9400


class ServingSettings(CommonSettings):
    serving_host: str = "127.0.0.1"
    serving_port: int = 8081
