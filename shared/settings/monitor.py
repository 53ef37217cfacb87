"""The monitor's settings: sampling, alerts, idle reclaim, the GPU history."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode

from gpuyard.shared.settings.common import (
    Duration,
    KeepFor,
    PortOrAny,
    Size,
    TenantDurations,
    TenantNumbers,
    comma_list,
    written,
)
from gpuyard.shared.settings.scrape import ScrapeSettings


class MonitorSettings(ScrapeSettings):
    """The monitor: one per node. It samples the node's GPUs (NVML, or the virtual GPUs of `--simulate-gpus`),
    publishes `gpu.sample`, serves Prometheus `/metrics` with the DCGM exporter's names, and raises and
    resolves alerts (docs/monitor.md)."""

    node_name: str = Field(
        default_factory=socket.gethostname,
        description="The node whose GPUs it samples: the executor's node name (default: hostname).",
    )
    simulate_gpus: int = Field(
        0,
        description="Virtual GPUs of the node when NVML finds none: each reports the CPU use of the job "
        "replica placed on it as its utilization, and its slice as its memory (docs/monitor.md).",
    )
    simulated_gpu_model: str = Field(
        "SIM-GPU", description="Model name of the simulated GPUs (the executor's)."
    )
    simulated_gpu_memory: Size = Field(
        written("16GiB"), description="Memory of each simulated GPU (the executor's)."
    )
    sample_interval: Duration = Field(
        1.0, gt=0, description="Seconds between two samples of the node's GPUs (one `gpu.sample` each)."
    )
    jobs_interval: Duration = Field(
        2.0,
        gt=0,
        description="Seconds between two reads of the live jobs from the event store (only those that "
        "changed are read): the holders of the node's GPUs and the platform figures of /metrics.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address of the Prometheus /metrics endpoint.")
    metrics_port: PortOrAny = Field(
        9400,
        description="Port of the Prometheus /metrics endpoint (the DCGM exporter's); 0 picks a free one.",
    )
    metrics_scope: Literal["cluster", "node"] = Field(
        "cluster",
        description="cluster: /metrics shows every node's GPUs (their `gpu.sample` events) and the platform "
        "figures; node: this node's GPUs only (one monitor per node, each scraped, as a DaemonSet is).",
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, as the scheduler's `quotas` (the same variable): the "
        "guaranteed figure of /metrics.",
    )
    alert_rules: Path | None = Field(
        None,
        description="A YAML file of alert rules that replace the defaults' thresholds and times "
        "(docs/alerts.md); default: the built-in rules.",
    )
    alert_webhooks: Annotated[list[str], NoDecode, BeforeValidator(comma_list)] = Field(
        default_factory=list,
        description="URLs every alert.raised and alert.resolved is POSTed to (Slack-compatible JSON), "
        "comma-separated.",
    )
    webhook_timeout: Duration = Field(5.0, gt=0, description="Seconds a webhook may take to answer.")
    webhook_max_backoff: Duration = Field(
        300.0, gt=0, description="Longest wait between two tries of a failing webhook (the wait doubles)."
    )
    history_raw_keep: Duration = Field(
        3600.0,
        gt=0,
        description="How long the GPU history keeps every sample of the node's GPUs (`gpu_history.db` beside "
        "a SQLite event store, or its MongoDB database); older ones are merged into one point per `history_bucket`.",
    )
    history_bucket: Duration = Field(
        60.0,
        gt=0,
        description="Seconds each point of the older GPU history stands for (a minute by default).",
    )
    history_keep: Duration = Field(
        7 * 86400.0,
        gt=0,
        description="How long the GPU history keeps its points at all (`7d`): the span of `gpuyard usage`'s "
        "used GPU-hours and of a job's GPU figures.",
    )
    history_flush_interval: Duration = Field(
        5.0, gt=0, description="Seconds between two writes of the node's samples to the GPU history."
    )
    idle_timeouts: TenantDurations = Field(
        default_factory=dict,
        description="Idle-GPU reclaim: the `idle_timeout` of a tenant's jobs that give none, `vision=30m,nlp=1h` "
        "(`*`: every other tenant; 0 or off: none); empty: only jobs that ask are stopped for idle GPUs "
        "(docs/monitor.md).",
    )
    idle_threshold_pct: float = Field(
        5.0,
        ge=0,
        le=100,
        description="Idle-GPU reclaim: a job's GPUs are idle while every sample of each of them reads under "
        "this utilization, in %.",
    )
    idle_grace: Duration = Field(
        600.0,
        gt=0,
        description="Idle-GPU reclaim: time between a job's idle warning and its stop, for jobs that give no "
        "`idle_grace`.",
    )
    idle_min_age: KeepFor = Field(
        300.0,
        ge=0,
        description="Idle-GPU reclaim: the start-up allowance: samples of a job's first minutes (from its start) "
        "do not count towards its idle timeout.",
    )
