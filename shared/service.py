"""What every service process does the same way: settings from flags and env, logging, connecting to NATS
and the store (waiting for them at start-up), health probes, a heartbeat, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from shared.bus import Bus, BusUnavailable
from shared.events import ServiceHeartbeat, make_event
from shared.health import HealthServer
from shared.ledger import JobLedger
from shared.logstore import LogStore, open_log_store
from shared.settings import CommonSettings, S, settings_from_argv
from shared.store import EventStore, StoreUnavailable, open_store

VERSION = "0.1.0"
log = logging.getLogger("gpuyard.service")


def setup_logging(name: str, level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("nats").setLevel(logging.WARNING)


class Service:
    def __init__(
        self, name: str, settings: CommonSettings, *, needs_store: bool = True, needs_logs: bool = False
    ):
        self.name = name
        self.settings = settings
        self.source = f"/gpuyard/{name}/{settings.instance}"
        self.needs_store = needs_store
        self.needs_logs = needs_logs
        self.bus: Bus | None = None
        self.store: EventStore | None = None
        self.logs: LogStore | None = None
        """Jobs' output (`shared.logstore`), for the services that write or read it (needs_logs)."""
        self.ledger: JobLedger | None = None
        self.health: HealthServer | None = None
        self.started_at = datetime.now(UTC)
        self.stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.ready = False
        self.failed = False

    async def start(self, *, wait_seconds: float = 60) -> None:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self.bus = await Bus.connect(
                    self.settings.nats_servers,
                    name=f"gpuyard-{self.name}",
                    source=self.source,
                    replicas=self.settings.stream_replicas,
                    connect_timeout=2,
                )
                break
            except BusUnavailable as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("waiting for NATS: %s", exc)
                await asyncio.sleep(0.5)
        await self.bus.ensure_streams()
        if self.needs_store:
            self.store = await open_store(self.settings.store_url)
            self.ledger = JobLedger(self.store, self.bus, self.source)
            self.ledger.start_relay()
        if self.needs_logs:
            self.logs = await open_log_store(self.settings.log_store_url)
        self.health = HealthServer(
            self.name, lambda: self.ready, host=self.settings.health_host, port=self.settings.health_port
        )
        port = await self.health.start()
        log.info("%s %s started (pid %d, health on port %d)", self.name, VERSION, os.getpid(), port)
        self.spawn(self._heartbeat(), "service-heartbeat")

    def spawn(self, coro: Awaitable, name: str) -> asyncio.Task:
        task = asyncio.create_task(self._guard(coro, name), name=name)
        self._tasks.append(task)
        return task

    async def _guard(self, coro: Awaitable, name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: background task %s crashed; stopping the service", self.name, name)
            self.failed = True
            self.stopping.set()

    async def _heartbeat(self, interval: float = 5.0) -> None:
        data = ServiceHeartbeat(
            service=self.name,
            instance=self.settings.instance,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=self.started_at,
            version=VERSION,
        )
        while True:
            with contextlib.suppress(Exception):
                await self.bus.publish(make_event(data, source=self.source))
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        main = next((t for t in self._tasks if t.get_name() == "main"), None)
        if main is not None and not main.done():  # main returns once `stopping` is set: let it clean up
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(main), 20)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.ledger:
            await self.ledger.close()
        if self.bus:
            await self.bus.close()
        if self.store:
            await self.store.close()
        if self.logs:
            await self.logs.close()
        if self.health:
            await self.health.stop()


def run_service(
    name: str,
    settings_cls: type[S],
    main: Callable[[Service, S], Awaitable[None]],
    *,
    argv: list[str] | None = None,
    needs_store: bool = True,
    needs_logs: bool = False,
    preflight: Callable[[S], str | None] | None = None,
) -> None:
    """Entry point of `python -m services.<name>`: run `main` until SIGTERM/SIGINT, then stop cleanly.
    `preflight(settings)` may refuse to start (it returns the reason) before anything is connected."""
    settings = settings_from_argv(settings_cls, argv, f"python -m services.{name}")
    setup_logging(name, settings.log_level)
    refusal = preflight(settings) if preflight else None
    if refusal:
        log.error("%s refuses to start: %s", name, refusal)
        sys.exit(2)

    async def runner() -> int:
        service = Service(name, settings, needs_store=needs_store, needs_logs=needs_logs)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stopping.set)
        try:
            await service.start()
            service.spawn(main(service, settings), "main")
            service.ready = True
            await service.stopping.wait()
            log.info("%s stopping", name)
            return 1 if service.failed else 0
        except (BusUnavailable, StoreUnavailable) as exc:
            log.error("%s cannot start: %s", name, exc)
            return 2
        finally:
            await service.stop()

    with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as loop_runner:
        sys.exit(loop_runner.run(runner()))


def event_loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (Linux and macOS): the same asyncio API at a fraction of the cost per
    message, which is most of what a service does. `asyncio` keeps the standard loop; None: the setting
    `event_loop` (GPUYARD_EVENT_LOOP)."""
    if (choice or CommonSettings().event_loop) == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
