"""Settings of every service, read from GPUYARD_* environment variables (and CLI flags mapped onto them).

Nothing else in the project reads os.environ for configuration.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "gpuyard"


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


class ExecutorSettings(CommonSettings):
    node_name: str = Field(default_factory=socket.gethostname)
    simulate_gpus: int = Field(0, description="Announce N virtual GPUs when NVML finds none.")
    simulated_gpu_model: str = "SIM-GPU"
    simulated_gpu_memory: str = "16GiB"
    executor_backend: str = Field("local", description="local or kubernetes")
    heartbeat_interval: float = 5.0
    grace_seconds: float = Field(10.0, description="SIGTERM-to-SIGKILL grace when stopping a job.")
    retry_backoff: float = Field(5.0, description="Seconds before the first retry; doubles each attempt.")
    event_concurrency: int = Field(
        64, description="Job events handled at once (events of one job always in order)."
    )


class MonitorSettings(CommonSettings):
    node_name: str = Field(default_factory=socket.gethostname)
    simulate_gpus: int = 0
    sample_interval: float = 5.0
    metrics_port: int = 9400


class ServingSettings(CommonSettings):
    serving_host: str = "127.0.0.1"
    serving_port: int = 8081
