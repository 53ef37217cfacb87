"""`gpuyard up`'s options: its flags (those that set a service setting are that setting's, with its
description as their help) and what they give. Light: the CLI reads them without the platform's packages."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from gpuyard.shared.settings.common import CommonSettings
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import default_text, env_name
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.submit import SubmitSettings

# `gpuyard up`'s flags that set a service setting: flag -> the settings model and field. A flag not given
# passes nothing, so the service's own default, or the GPUYARD_* variable the user exported, applies.
SETTING_FLAGS: dict[str, tuple[type[CommonSettings], str]] = {
    "--data-dir": (CommonSettings, "data_dir"),
    "--host": (SubmitSettings, "submit_host"),
    "--port": (SubmitSettings, "submit_port"),
    "--policy": (SchedulerSettings, "policy"),
    "--simulate-gpus": (ExecutorSettings, "simulate_gpus"),
    "--node-name": (ExecutorSettings, "node_name"),
    "--serving-port": (ServingSettings, "serving_port"),
    "--monitor-port": (MonitorSettings, "metrics_port"),
}
UP_NOTES = {"--host": "The embedded NATS server listens there too."}
DEFAULT_NATS_PORT = 4222
ROUTE_PORT_OFFSET = 2000
"""A clustered bus's server k routes to the others on `--nats-port` + ROUTE_PORT_OFFSET + k (6222, 6223, 6224 by
default: NATS's own cluster port and the next ones)."""
CLUSTER_REPLICAS = 3
"""Replicas of each stream on a clustered bus: as many as servers, up to JetStream's usual R3."""


def default_executors() -> int:
    """Two executor processes where the cores can carry them (one process caps a node at a few hundred short
    jobs a second), one on a machine of one or two cores: there the cores, not the process, are the limit, and a
    second process costs CPU per job (every job's end reaches both; each has a reaper, claims, consumers). With
    20,000 jobs queued on two cores, one drained 229.8 jobs/s against 205.3 with two (docs/benchmarks.md)."""
    return 1 if (os.cpu_count() or 1) <= 2 else 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`gpuyard up`'s flags; the help of those that set a service setting is that setting's description."""
    for flag, (model, name) in SETTING_FLAGS.items():
        field = model.model_fields[name]
        default = default_text(field).replace("`", "")
        fallback = "the default above" if default == "see description" else default
        parts = (field.description, UP_NOTES.get(flag), f"Not given: ${env_name(name)}, else {fallback}.")
        parser.add_argument(
            flag,
            dest=name,
            default=None,
            metavar=flag.removeprefix("--").replace("-", "_").upper(),
            help=" ".join(part for part in parts if part),
        )
    parser.add_argument(
        "--nats-port",
        type=int,
        default=DEFAULT_NATS_PORT,
        help=f"port of the embedded NATS server ({DEFAULT_NATS_PORT})",
    )
    parser.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="NATS servers to run as one JetStream cluster on this machine (1: a single server; 3: a cluster "
        "that survives the loss of any one server, each stream replicated on 3). Server k listens on "
        f"--nats-port + k and routes on --nats-port + {ROUTE_PORT_OFFSET} + k; every service gets them all",
    )
    parser.add_argument(
        "--executors",
        type=int,
        default=default_executors(),
        metavar="N",
        help="executor processes sharing this node's jobs (default: 2, or 1 on one or two cores)",
    )
    parser.add_argument(
        "--service-metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="first port of the scheduler's and the executors' own Prometheus /metrics: the scheduler's "
        "PORT, executor k's PORT+1+k (default: free ports; the data dir's prometheus-targets.json lists them)",
    )
    parser.add_argument("--demo", action="store_true", help="submit a demo job once the platform is up")


@dataclass
class UpOptions:
    given: dict[str, str] = field(default_factory=dict)
    """Service settings set through `gpuyard up`'s flags, by field name (see SETTING_FLAGS)."""
    nats_port: int = DEFAULT_NATS_PORT
    nats_cluster: int = 1
    """NATS servers run as one JetStream cluster (1: a single server, not clustered)."""
    executors: int = field(default_factory=default_executors)
    """Executor processes sharing the node's placements."""
    demo: bool = False
    service_metrics_port: int | None = None
    """First port of the `OWN_METRICS` services' own /metrics; None: free ports."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> UpOptions:
        names = (name for _, name in SETTING_FLAGS.values())
        given = {name: str(getattr(args, name)) for name in names if getattr(args, name) is not None}
        if args.nats_cluster > 1 and env_name("stream_replicas") not in os.environ:
            given["stream_replicas"] = str(min(args.nats_cluster, CLUSTER_REPLICAS))  # (else: the user's)
        return cls(
            given=given,
            nats_port=args.nats_port,
            nats_cluster=args.nats_cluster,
            executors=args.executors,
            demo=args.demo,
            service_metrics_port=args.service_metrics_port,
        )

    @property
    def nats_ports(self) -> list[int]:
        """The client port of each NATS server, the first `--nats-port`."""
        return [self.nats_port + k for k in range(max(self.nats_cluster, 1))]

    @property
    def route_ports(self) -> list[int]:
        """The cluster (route) port of each NATS server; none for a single server."""
        if self.nats_cluster <= 1:
            return []
        return [self.nats_port + ROUTE_PORT_OFFSET + k for k in range(self.nats_cluster)]

    def nats_url(self, host: str) -> str:
        """Every NATS server's URL, comma-separated, as the services' `nats_url` takes them."""
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        host = f"[{host}]" if ":" in host else host
        return ",".join(f"nats://{host}:{port}" for port in self.nats_ports)
