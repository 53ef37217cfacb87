"""What every service process does the same way: settings from flags and env, logging, connecting to NATS
and the store (waiting for them at start-up), health probes, its own Prometheus figures (`gpuyard.shared.runtime.servicemetrics`:
the registry, the backlog of its consumers read every `consumer_lag_interval`, and a /metrics port of its own
when `service_metrics_port` is set), a heartbeat (which says where its /metrics is), and a clean stop on
SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from gpuyard.shared.bus.credentials import CredentialsError, read_credentials
from gpuyard.shared.bus.jetstream import Bus, BusRefused, BusUnavailable
from gpuyard.shared.bus.metrics import BusMetrics
from gpuyard.shared.bus.permissions import publishes
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.services import SERVICE_HEARTBEAT_SECONDS, ServiceHeartbeat
from gpuyard.shared.contracts.events.subjects import STREAMS
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.runtime.collector import collect_less
from gpuyard.shared.runtime.health import HealthServer
from gpuyard.shared.runtime.servicemetrics import METRICS_PATH, MetricsServer, service_registry
from gpuyard.shared.settings.common import EXIT_REFUSED, CommonSettings, S, settings_from_argv
from gpuyard.shared.stores.events import EventStore, StoreUnavailable, open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import LogStore, open_log_store

log = logging.getLogger("gpuyard.service")
REQUEST_LOCK_TIMEOUT_SECONDS = 5.0
"""Seconds a service that answers requests waits for the event store's write lock another process holds before
its answer is 503 with Retry-After (StoreBusy): well within its clients' timeout (30 s), which a wait as long
as the other services' (`gpuyard.shared.stores.events.sqlite.LOCK_TIMEOUT_SECONDS`, 30 s) would outlast."""
ANSWERS_REQUESTS = frozenset({"submit"})
"""The services whose writes a client waits on (the API): their store waits REQUEST_LOCK_TIMEOUT_SECONDS."""


def setup_logging(name: str, level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("nats").setLevel(logging.WARNING)


T = TypeVar("T")


class NotOpen(RuntimeError):
    """What a service is started with (its bus, event store, job ledger, log store) read before `Service.start`
    opened it, or one the service does not open: a mistake in its wiring, never a condition to handle."""


class Service:
    def __init__(
        self, name: str, settings: CommonSettings, *, needs_store: bool = True, needs_logs: bool = False
    ):
        self.name = name
        self.settings = settings
        self.source = f"/gpuyard/{name}/{settings.instance}"
        self.needs_store = needs_store
        self.needs_logs = needs_logs
        self._bus: Bus | None = None
        self._store: EventStore | None = None
        self._ledger: JobLedger | None = None
        self._logs: LogStore | None = None
        self.health: HealthServer | None = None
        self.metrics = service_registry(name, settings.instance, VERSION)
        """This process's Prometheus figures; its bus counts into it (`bus_metrics`)."""
        self.bus_metrics = BusMetrics(self.metrics)
        self.metrics_server: MetricsServer | None = None
        self.metrics_url: str | None = None
        """The URL of this process's /metrics, said in its heartbeat: its own port's (`serve_metrics`), or where
        its service serves them (`metrics_served_on`); None: nowhere."""
        self.started_at = datetime.now(UTC)
        self.stopping = asyncio.Event()
        self.stop_signal: int | None = None
        """The signal that stopped the service first, if a signal did (SIGINT: a deliberate stop, SIGTERM: a
        service manager's stop or restart; the executor stops its jobs on the first only)."""
        self._tasks: list[asyncio.Task] = []
        self.ready = False
        self.failed = False

    async def start(self, *, wait_seconds: float = 60) -> None:
        deadline = time.monotonic() + wait_seconds
        path = self.settings.nats_credentials
        credentials = read_credentials(path) if path else None
        while True:
            try:
                bus = await Bus.connect(
                    self.settings.nats_servers,
                    name=f"gpuyard-{self.name}",
                    source=self.source,
                    replicas=self.settings.stream_replicas,
                    connect_timeout=2,
                    credentials=credentials,
                    tls_ca=self.settings.nats_tls_ca,
                    metrics=self.bus_metrics,
                )
                break
            except BusUnavailable as exc:
                if isinstance(exc, BusRefused) or time.monotonic() > deadline:
                    raise
                log.info("waiting for NATS: %s", exc)
                await asyncio.sleep(0.5)
        self._bus = bus
        limits = self.settings.stream_max_bytes, self.settings.stream_max_msgs
        await bus.ensure_streams(tuple(s.limited(*limits) for s in STREAMS))
        if self.needs_store:
            self._store = store = await open_store(
                self.settings.store_url,
                durable_commits=self.settings.store_durable_commits,
                lock_timeout=store_lock_timeout(self.name),
            )
            self._ledger = JobLedger(store, bus, self.source, publishes=publishes(self.name))
            self._ledger.start_relay()
        if self.needs_logs:
            self._logs = await open_log_store(self.settings.log_store_url)
        self.health = HealthServer(
            self.name,
            lambda: self.ready and not self.stopping.is_set(),
            host=self.settings.health_host,
            port=self.settings.health_port,
            detail=bus.state.report,  # the bus's trouble, said (its outbox keeps the service working meanwhile)
        )
        port = await self.health.start()
        self.serve_metrics()
        log.info("%s %s started (pid %d, health on port %d)", self.name, VERSION, os.getpid(), port)
        self.spawn(self._heartbeat(bus), "service-heartbeat")
        self.spawn(self._consumer_lags(bus), "consumer-lag")

    # What the service is started with: each one opened by `start` (the event store and the job ledger where
    # `needs_store`, the log store where `needs_logs`), before `run_service` runs the service's main.

    @property
    def bus(self) -> Bus:
        """The bus, connected by `start`."""
        return self._opened(self._bus, "bus")

    @property
    def store(self) -> EventStore:
        """The event store, opened by `start` (needs_store)."""
        return self._opened(self._store, "event store", needs="needs_store", needed=self.needs_store)

    @property
    def ledger(self) -> JobLedger:
        """The job ledger on the event store (the only way a service changes a job), made by `start` (needs_store)."""
        return self._opened(self._ledger, "job ledger", needs="needs_store", needed=self.needs_store)

    @property
    def logs(self) -> LogStore:
        """Jobs' output (`gpuyard.shared.stores.logs`), opened by `start` for the services that write or read it
        (needs_logs)."""
        return self._opened(self._logs, "log store", needs="needs_logs", needed=self.needs_logs)

    def _opened(self, opened: T | None, what: str, *, needs: str = "", needed: bool = True) -> T:
        if opened is None:
            why = "call start() first" if needed else f"the service is made without {needs}=True"
            raise NotOpen(f"the {self.name} service's {what} is not open: {why}")
        return opened

    def serve_metrics(self) -> None:
        """/metrics on `service_metrics_port` when set; a port that is taken is said and the service goes on
        without it (as the monitor's /metrics)."""
        host, port = self.settings.service_metrics_host, self.settings.service_metrics_port
        if port is None:
            return
        try:
            self.metrics_server = MetricsServer(self.metrics, host, port).start()
        except OSError as exc:
            log.error("cannot serve /metrics on %s:%d: %s; going on without it", host, port, exc)
            return
        log.info("Prometheus /metrics on http://%s:%d/metrics", host, self.metrics_server.port)
        self.metrics_url = metrics_url(host, self.metrics_server.port)

    def metrics_served_on(self, host: str, port: int) -> None:
        """The service serves this process's figures on `host:port` too, once it listens there (the submit API,
        the serving API, the monitor's /metrics): its heartbeat says so, unless it has a /metrics port of its
        own (`serve_metrics`)."""
        if self.metrics_server is None:
            self.metrics_url = metrics_url(host, port)

    def stop_by(self, sig: int) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig
        self.stopping.set()

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

    def heartbeat(self) -> ServiceHeartbeat:
        """What this process says of itself every SERVICE_HEARTBEAT_SECONDS."""
        return ServiceHeartbeat(
            service=self.name,
            instance=self.settings.instance,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=self.started_at,
            version=VERSION,
            metrics=self.metrics_url,
        )

    async def _heartbeat(self, bus: Bus, interval: float = SERVICE_HEARTBEAT_SECONDS) -> None:
        while True:  # (made anew each time: the service may say where its /metrics is after the first)
            with contextlib.suppress(Exception):
                await bus.publish(make_event(self.heartbeat(), source=self.source))
            await asyncio.sleep(interval)

    async def _consumer_lags(self, bus: Bus) -> None:
        """The backlog of this process's consumers, for /metrics (`Bus.consumer_lags` never raises)."""
        while True:
            self.bus_metrics.lags = tuple(await bus.consumer_lags())
            await asyncio.sleep(self.settings.consumer_lag_interval)

    async def stop(self) -> bool:
        """Let main return (it does once `stopping` is set), cancel the other tasks, close the connections,
        each step bounded (STOP_SECONDS in all). False: something did not end in time (a task that ignores
        cancellation, a NATS drain with no server, ...), and the process must exit without waiting for it."""
        self.ready = False
        main = next((t for t in self._tasks if t.get_name() == "main"), None)
        clean = True
        if main is not None:
            clean &= await _bounded(main, MAIN_SECONDS, "main", cancel=False)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            clean &= await _bounded(
                asyncio.gather(*self._tasks, return_exceptions=True), STEP_SECONDS, "tasks"
            )
        if self._ledger:
            clean &= await _bounded(self._ledger.close(), STEP_SECONDS, "the outbox relay")
        closing = [c.close() for c in (self._bus, self._store, self._logs) if c is not None]
        closing += [self.health.stop()] if self.health else []
        closing += [asyncio.to_thread(self.metrics_server.stop)] if self.metrics_server else []
        if closing:
            clean &= await _bounded(asyncio.gather(*closing), STEP_SECONDS, "the connections")
        return clean


def store_lock_timeout(name: str) -> float | None:
    """Seconds the service `name` waits for the event store's write lock (None: the store's own default)."""
    return REQUEST_LOCK_TIMEOUT_SECONDS if name in ANSWERS_REQUESTS else None


def metrics_url(host: str, port: int) -> str:
    """The URL of a /metrics served on `host:port`, as other machines reach it: this host's name where it
    listens on every address (as the serving API's advertised URL)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{METRICS_PATH}"


MAIN_SECONDS = 6.0
"""How long main may take to return once the service is stopping."""
STEP_SECONDS = 2.0
"""How long each other step of a stop may take: the tasks' cancellation, the relay, closing connections."""
STOP_SECONDS = MAIN_SECONDS + 3 * STEP_SECONDS
"""The most a stop takes; its supervisor (`gpuyard up`) waits 15 s before it kills a service."""


async def _bounded(step: Awaitable, seconds: float, what: str, *, cancel: bool = True) -> bool:
    """Wait for `step` at most `seconds`; True if it ended in time. One that did not is cancelled (if
    `cancel`) but not waited for: it may ignore cancellation."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        log.warning("stopping: %s did not end within %.0fs; going on without it", what, seconds)
        if cancel:
            task.cancel()
        return False
    if not task.cancelled() and task.exception() is not None:
        log.warning("stopping: %s failed: %r", what, task.exception())
    return True


def run_service(
    name: str,
    settings_cls: type[S],
    main: Callable[[Service, S], Awaitable[None]],
    *,
    argv: list[str] | None = None,
    needs_store: bool = True,
    needs_logs: bool = False,
    preflight: Callable[[S], str | None] | None = None,
    pauses_matter: bool = False,
) -> None:
    """Entry point of `python -m gpuyard.services.<name>`: run `main` until SIGTERM/SIGINT, then stop cleanly.
    `preflight(settings)` may refuse to start (it returns the reason) before anything is connected;
    `pauses_matter`: requests wait on the service, so its garbage collections stay short (`gpuyard.shared.runtime.collector`)."""
    settings = settings_from_argv(settings_cls, argv, f"python -m gpuyard.services.{name}")
    setup_logging(name, settings.log_level)
    refusal = preflight(settings) if preflight else None
    if refusal:
        log.error("%s refuses to start: %s", name, refusal)
        sys.exit(EXIT_REFUSED)

    os.umask(
        0o077
    )  # the platform's files are its own (the executor gives its jobs 0o022 back: executor/main.py)

    async def runner() -> int:
        service = Service(name, settings, needs_store=needs_store, needs_logs=needs_logs)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(
                sig, service.stop_by, sig
            )  # again while stopping: no matter, its stop is bounded
        _watch_supervisor(loop, service)
        code = 1
        try:
            await service.start()
            collect_less(pauses_matter=pauses_matter)
            service.spawn(main(service, settings), "main")
            service.ready = True
            await service.stopping.wait()
            log.info("%s stopping", name)
            code = 1 if service.failed else 0
        except (BusRefused, CredentialsError) as exc:  # its configuration: starting again will not help
            log.error("%s refuses to start: %s", name, exc)
            code = EXIT_REFUSED
        except (BusUnavailable, StoreUnavailable) as exc:  # another service is not there yet: a restart may
            log.error("%s cannot start: %s", name, exc)
            code = 1
        finally:
            _exit_after(STOP_SECONDS + 3, code if code else 1)  # whatever hangs in the stop or after it
            if not await service.stop():
                _exit_now(code)  # something ignored its cancellation: the loop's own close would wait for it
        return code

    with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as loop_runner:
        sys.exit(loop_runner.run(runner()))


def _watch_supervisor(loop: asyncio.AbstractEventLoop, service: Service) -> None:
    """With `supervisor_pid` set (by `gpuyard up`), a thread (it sees it even with the loop stuck) stops the service once that
    process is no longer its parent (it died: the service was handed to init), and ends it STOP_SECONDS
    later if the stop is stuck."""
    supervisor = service.settings.supervisor_pid
    if not supervisor:
        return

    def watch() -> None:
        until_gone(supervisor)
        log.error("%s: its supervisor (pid %d) is gone; stopping", service.name, supervisor)
        service.failed = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting anyway
            loop.call_soon_threadsafe(service.stopping.set)
        _exit_after(STOP_SECONDS + 3, 1)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def until_gone(supervisor: int) -> None:
    """Return once `supervisor` is no longer this process's parent. A pidfd (Linux 5.3+) becomes readable when
    the process ends: the thread sleeps in one call instead of waking every 0.2 s (each wake took the GIL from
    a busy service); without one, it polls."""
    try:
        pidfd = os.pidfd_open(supervisor)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            if os.getppid() == supervisor:  # (opened while it was still the parent: the same process)
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                poller.poll()
        finally:
            os.close(pidfd)
    while os.getppid() == supervisor:  # (the parent changes as the supervisor's exit completes)
        time.sleep(0.2)


def _exit_after(seconds: float, code: int) -> None:
    """End the process in `seconds` if it has not ended by then: a stop stuck in a blocking call, a thread
    that interpreter shutdown waits for."""
    timer = threading.Timer(seconds, _exit_now, (code,))
    timer.daemon = True
    timer.start()


def _exit_now(code: int) -> None:
    log.warning("exiting with status %d without waiting for the rest", code)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


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
