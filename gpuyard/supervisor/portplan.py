"""The ports of a platform that `gpuyard up` plans: its own port flags checked, the ports it picks for each
process's own /metrics and health endpoints (`gpuyard.supervisor.ports`: below the kernel's ephemeral range,
none of the ports the settings name), and every port its processes will listen on, with what sets it
(`wanted_ports`, checked before anything starts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuyard.shared.settings.common import CommonSettings, settings_from_argv
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import env_name
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.submit import SubmitSettings
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.ports import Wanted, free_ports, loopback_for
from gpuyard.supervisor.servicecommands import OWN_METRICS, SERVICES, settings_flags

if TYPE_CHECKING:
    from gpuyard.supervisor.plan import Plan

HIGHEST_PORT = 65535
PICKED = "a port `gpuyard up` picked"
PICKED_REMEDY = "start it again (the port was free when it was picked)"


def check_port_flags(opts: UpOptions) -> None:
    """`gpuyard up`'s own port flags (the others are settings, checked as each service checks them)."""
    if opts.nats_cluster < 1 or opts.nats_cluster == 2:
        raise SystemExit(
            f"--nats-cluster {opts.nats_cluster}: 1 (one server) or 3 and more (a cluster of 2 stops with either "
            "server: JetStream needs a majority)"
        )
    highest = max(opts.nats_ports + opts.route_ports)  # (a clustered bus's servers take the ports above)
    if opts.nats_port < 1 or highest > HIGHEST_PORT:
        top = HIGHEST_PORT - (highest - opts.nats_port)
        servers = f" for {opts.nats_cluster} servers" if opts.nats_cluster > 1 else ""
        raise SystemExit(f"--nats-port {opts.nats_port} is not a port{servers}: 1 to {top}")
    first, count = opts.service_metrics_port, 1 + max(opts.executors, 1)
    if first is not None and not 1 <= first <= HIGHEST_PORT - count + 1:
        raise SystemExit(
            f"--service-metrics-port {first} is not a port for {count} processes: 1 to {HIGHEST_PORT - count + 1}"
        )


def named_ports(opts: UpOptions, api: SubmitSettings) -> frozenset[int]:
    """The ports the platform's settings name (the API's, NATS', serving's, the monitor's): none of the ports
    picked for the rest may be one of them, though nothing is bound there yet."""
    serving = settings_from_argv(ServingSettings, settings_flags(ServingSettings, opts.given), "gpuyard up")
    monitor = settings_from_argv(MonitorSettings, settings_flags(MonitorSettings, opts.given), "gpuyard up")
    nats = {*opts.nats_ports, *opts.route_ports}
    return frozenset({api.submit_port, *nats, serving.serving_port, monitor.metrics_port})


def own_metrics_ports(opts: UpOptions, host: str, named: frozenset[int]) -> list[int]:
    """The ports of the scheduler's and each executor's own /metrics, in that order."""
    count = 1 + max(opts.executors, 1)
    if opts.service_metrics_port is not None:
        return [opts.service_metrics_port + i for i in range(count)]
    return free_ports(loopback_for(host), count, named)


def own_health_ports(opts: UpOptions, host: str, env: dict[str, str], named: frozenset[int]) -> list[int]:
    """A port of its own for each process's /healthz and /readyz, picked as the others (`gpuyard.supervisor.ports`: below
    the kernel's ephemeral range), so that no health endpoint bound to port 0 takes a port the user chose in
    that range (`--port 40000`) before its owner binds it; none where the environment names the health port."""
    if env_name("health_port") in env:
        return []
    count = len(SERVICES) - 1 + max(opts.executors, 1)
    return free_ports(loopback_for(host), count, named)


def wanted_ports(platform: Plan, opts: UpOptions, env: dict[str, str]) -> list[Wanted]:
    """Every port the platform's processes will listen on, with what sets it: the API's, NATS', serving's and
    the monitor's, then each process's own /metrics and health ports (those that name 0, any free port, bind
    whatever is free and are left out)."""
    s = platform.settings
    api, serving = platform.submit, platform.settings_of("serving", ServingSettings)
    wanted = [
        Wanted("the API", api.submit_host, api.submit_port, "--port", "pass --port"),
        *nats_ports(platform.nats_host, opts),
        Wanted(
            "the serving API",
            serving.serving_host,
            serving.serving_port,
            "--serving-port",
            "pass --serving-port",
        ),
    ]
    monitor = platform.settings_of("monitor", MonitorSettings)
    if monitor.metrics_port:  # (0: any free port)
        what = "the monitor's /metrics"
        wanted.append(
            Wanted(what, monitor.metrics_host, monitor.metrics_port, "--monitor-port", "pass --monitor-port")
        )
    children = platform.children
    wanted += [_metrics_port(c, s[c.name], opts) for c in children if s[c.name].service_metrics_port]
    wanted += [_health_port(c, s[c.name], env) for c in children if s[c.name].health_port]
    return wanted


def nats_ports(host: str, opts: UpOptions) -> list[Wanted]:
    """The NATS servers' ports: each one's client port and, on a clustered bus, its route port (on loopback)."""
    if opts.nats_cluster <= 1:
        return [Wanted("NATS", host, opts.nats_port, "--nats-port", "pass --nats-port")]
    source, remedy = "--nats-port", "pass another --nats-port (server k takes it + k, and + 2000 + k)"
    wanted = [
        Wanted(f"NATS server {k}", host, port, source, remedy) for k, port in enumerate(opts.nats_ports, 1)
    ]
    routes = enumerate(opts.route_ports, 1)
    return wanted + [
        Wanted(f"the routes of NATS server {k}", loopback_for(host), p, source, remedy) for k, p in routes
    ]


def _metrics_port(child: Child, own: CommonSettings, opts: UpOptions) -> Wanted:
    """The port of `child`'s own /metrics, and what set it."""
    if (child.service or child.name) not in OWN_METRICS:  # only the variable gives it one
        source = env_name("service_metrics_port")
        remedy = f"unset {source} (the APIs and the monitor serve their figures on their own port)"
    elif opts.service_metrics_port is not None:
        source, remedy = "--service-metrics-port", "pass another --service-metrics-port"
    else:
        source, remedy = PICKED, PICKED_REMEDY
    what = f"the /metrics of {child.name}"
    # only the children with a /metrics port of their own are asked (`wanted_ports`)
    assert own.service_metrics_port is not None
    return Wanted(what, own.service_metrics_host, own.service_metrics_port, source, remedy)


def _health_port(child: Child, own: CommonSettings, env: dict[str, str]) -> Wanted:
    """The port of `child`'s health endpoints, and what set it."""
    if env_name("health_port") in env:
        source = env_name("health_port")
        remedy = f"unset {source}: `gpuyard up` gives each process a port of its own"
    else:
        source, remedy = PICKED, PICKED_REMEDY
    return Wanted(f"the health endpoints of {child.name}", own.health_host, own.health_port, source, remedy)
