"""What `gpuyard up` starts (`plan`): the service processes in start order, each with its command line and
the settings it will run with, and every port they will listen on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, TypeVar

from gpuyard.shared.bus.credentials import credentials_path
from gpuyard.shared.settings.common import CommonSettings, settings_from_argv
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.gateway import GATEWAY_TOKEN_FILE
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import env_name
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.submit import SubmitSettings
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.datadir import TOKENS_FILE
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.portplan import (
    check_port_flags,
    named_ports,
    own_health_ports,
    own_metrics_ports,
    wanted_ports,
)
from gpuyard.supervisor.ports import Wanted, loopback_for
from gpuyard.supervisor.servicecommands import SERVICES, health_flags, service_command, settings_flags

S = TypeVar("S", bound=CommonSettings)


class ScrapeTarget(TypedDict):
    """One target of a Prometheus file_sd file."""

    targets: list[str]
    labels: dict[str, str]


@dataclass
class Plan:
    """What `gpuyard up` starts, and the settings each service process will run with: every process gets the
    environment unchanged, and as flags the settings `up` decides (flags win over variables)."""

    data_dir: Path
    nats_host: str
    nats_port: int
    children: list[Child]
    settings: dict[str, CommonSettings]
    """By child name, read exactly as the child will: its flags over this environment."""
    ports: list[Wanted] = field(default_factory=list)
    """Every port its processes will listen on (`wanted_ports`), checked before anything starts."""

    def settings_of(self, name: str, model: type[S]) -> S:
        """The settings of the child `name`, read with its service's `model` (SERVICES)."""
        settings = self.settings[name]
        if not isinstance(settings, model):
            raise TypeError(f"{name} runs with {type(settings).__name__}, not {model.__name__}")
        return settings

    @property
    def submit(self) -> SubmitSettings:
        return self.settings_of("submit", SubmitSettings)

    @property
    def executor(self) -> ExecutorSettings:
        return self.settings_of("executor", ExecutorSettings)

    @property
    def monitor(self) -> MonitorSettings | None:
        """The monitor's settings; None when it is not started."""
        return self.settings_of("monitor", MonitorSettings) if "monitor" in self.settings else None

    def metrics_targets(self) -> list[ScrapeTarget]:
        """Where Prometheus finds each service process's figures (but the monitor's, whose /metrics has its own
        scrape job), in the file_sd format: one target each, labelled with its process (`executor-1`); its
        service is the `service` label of its `gpuyard_service_info`."""
        targets: list[ScrapeTarget] = []
        for c in self.children:
            service, settings = c.service or c.name, self.settings[c.name]
            address: tuple[str, int]
            if service == "submit":
                api = self.settings_of(c.name, SubmitSettings)
                address = (api.submit_host, api.submit_port)
            elif service == "serving":
                serving = self.settings_of(c.name, ServingSettings)
                address = (serving.serving_host, serving.serving_port)
            elif settings.service_metrics_port is not None:
                address = (settings.service_metrics_host, settings.service_metrics_port)
            else:
                continue
            host = loopback_for(address[0])
            host = f"[{host}]" if ":" in host else host
            targets.append({"targets": [f"{host}:{address[1]}"], "labels": {"process": c.name}})
        return targets


def plan(opts: UpOptions, env: dict[str, str]) -> Plan:
    """The services' processes, in start order (one of each, `executors` executors), with their settings.
    `env` is what each process gets: this process's environment (plus what changes no setting), so the settings
    read here from it are theirs. A bad setting ends `gpuyard up` with one line before anything starts."""
    check_port_flags(opts)
    api = settings_from_argv(SubmitSettings, settings_flags(SubmitSettings, opts.given), "gpuyard up")
    data_dir = api.data_dir.expanduser().resolve()
    decided = decided_settings(opts, api, data_dir, env)
    env = {**env, **gateway_env(data_dir, env)}
    named = named_ports(opts, api)
    metrics = own_metrics_ports(opts, api.service_metrics_host, named)
    health = own_health_ports(opts, api.health_host, env, named | set(metrics))
    children = service_children(opts, decided, data_dir, env, iter(metrics), iter(health))
    settings = {
        c.name: settings_from_argv(
            SERVICES[c.service or c.name], c.argv[len(service_command(c.name)) :], f"gpuyard up: {c.name}"
        )
        for c in children
    }
    platform = Plan(data_dir, api.submit_host, opts.nats_port, children, settings)
    platform.ports = wanted_ports(platform, opts, env)
    return platform


def gateway_env(data_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """Where the submit service and the executors find the gateway token (`gpuyard.shared.settings.gateway`),
    unless the environment names it: the data dir's, which `prepare` makes."""
    name = env_name("gateway_token_file")
    return {} if name in env else {name: str(data_dir / GATEWAY_TOKEN_FILE)}


def decided_settings(
    opts: UpOptions, api: SubmitSettings, data_dir: Path, env: dict[str, str]
) -> dict[str, object]:
    """The settings `gpuyard up` gives every service as flags: its own flags', where NATS, the data dir and its
    tokens file are, and, unless the environment names them, the addresses the services tell each other."""
    decided: dict[str, object] = {
        **opts.given,
        "nats_url": opts.nats_url(api.submit_host),  # every server's, on a clustered bus
        "data_dir": data_dir,
        "tokens_file": data_dir / TOKENS_FILE,
    }
    if env_name("api_url") not in env:  # where jobs reach the API (their publish token's, docs/models.md)
        host = loopback_for(api.submit_host)
        decided["api_url"] = f"http://{host}:{api.submit_port}"
    if env_name("serving_url") not in env:  # where the dashboard's pages call the serving entry point
        serving = settings_from_argv(
            ServingSettings, settings_flags(ServingSettings, opts.given), "gpuyard up"
        )
        decided["serving_url"] = serving.advertised_url.replace(socket.gethostname(), "127.0.0.1")
    if env_name("dashboard_origins") not in env:  # whose pages may call the serving entry point (its CORS)
        decided["dashboard_origins"] = dashboard_origins(api.submit_host, api.submit_port)
    return decided


def service_children(
    opts: UpOptions,
    decided: dict[str, object],
    data_dir: Path,
    env: dict[str, str],
    metrics_ports: Iterator[int],
    health_ports: Iterator[int],
) -> list[Child]:
    """Each service's process (`opts.executors` executors), in start order: its command line with the
    `decided` settings, its bus user's credentials, and its own /metrics and health ports (from those given)."""
    children = []
    for name, model in SERVICES.items():
        own = {**decided, "nats_credentials": credentials_path(data_dir, name)}  # its bus user
        argv = [*service_command(name), *settings_flags(model, own)]
        if name == "scheduler":
            argv += settings_flags(model, {"service_metrics_port": next(metrics_ports)})
        if name != "executor":
            children.append(Child(name, [*argv, *health_flags(model, health_ports)], env))
            continue
        for worker in range(max(opts.executors, 1)):  # --executors 0 is refused by the first one's settings
            workers = {
                "executor_workers": opts.executors,
                "executor_worker": worker,
                "service_metrics_port": next(metrics_ports),
            }
            argv_worker = [*argv, *health_flags(model, health_ports)]
            label = name if worker == 0 else f"{name}-{worker}"
            children.append(Child(label, [*argv_worker, *settings_flags(model, workers)], env, service=name))
    return children


def dashboard_origins(host: str, port: int) -> str:
    """The dashboard's origins as a browser on this machine names them (the API's address, 127.0.0.1 and
    localhost): the serving entry point answers their pages' calls (GPUYARD_DASHBOARD_ORIGINS, when set, names them instead)."""
    names = ["127.0.0.1", "localhost"]
    if host not in ("0.0.0.0", "::", "", *names):
        names.insert(0, f"[{host}]" if ":" in host else host)
    return ",".join(f"http://{name}:{port}" for name in names)
