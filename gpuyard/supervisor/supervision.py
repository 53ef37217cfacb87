"""The supervision of `gpuyard up`'s processes: each started with its output read to its end (its log file and
the console), restarted with backoff when it exits (a crash loop said so, with its last words), its state told
on the bus (`report`: `service.status`), and all of them stopped in order, services first and NATS last."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from gpuyard.shared.contracts.events.services import ProcessState, ServiceStatus
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.settings.common import EXIT_REFUSED
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.jetstreamheal import JetStreamHealer
from gpuyard.supervisor.natsserver import jetstream_broken, shown
from gpuyard.supervisor.servicelog import ServiceLog, shorten
from gpuyard.supervisor.statusreport import last_words

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
READ_CHUNK = 64 * 1024
"""What the supervisor reads of a process's output at once (its pipe is always read, whatever it does with it)."""
LONGEST_LINE = 16 * 1024
"""A line longer than this is shown on the console in pieces (the log file has it whole)."""
STOP_POLL_SECONDS = 0.05
WATCH_SECONDS = 0.2
"""How often `watch` looks for a process that exited."""
LONGEST_BACKOFF = 30
"""Seconds at most before a process that keeps exiting is started again (doubling from 1)."""


class Supervisor:
    def __init__(
        self,
        console: Console,
        log_dir: Path,
        report: Callable[[ServiceStatus], None] | None = None,
        *,
        nats_store: Path | None = None,
        write: Callable[[int, memoryview], int] = os.write,
    ):
        """`report`: told the status of each service process it starts, and of each change (a
        `StatusReporter`'s `update`: it must neither block nor raise). `nats_store`: NATS's store directory,
        whose free space says when NATS can be restarted to heal JetStream (`JetStreamHealer`). `write`: how
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
        self.healer = JetStreamHealer(nats_store, self.say, self.restart, lambda: self.stopping)
        """Restarts NATS, whose JetStream failed a write, once its store has room again."""

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
        if self.report is None or is_nats(child) or child.proc is None:
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
        assert proc.stdout is not None  # `start` runs every process with stdout=PIPE
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
        if is_nats(child):
            if jetstream_broken(text):
                self.healer.heal(child, text)
            if not shown(text):
                return  # the banner and routine lines stay in the log file
        if text:
            child.last_line = shorten(text, child.service or child.name)
            child.ready = child.ready or STARTED_LINE in text
            self.say(child.name, escape(child.last_line))

    async def watch(self) -> None:
        """Restart any child that exits while the platform is up."""
        while not self.stopping:
            await asyncio.sleep(WATCH_SECONDS)
            for child in list(self.children.values()):
                proc = child.proc
                if proc is None or self.stopping or child.restarting:
                    continue
                if proc.returncode is None:
                    self._stable_again(child)
                    continue
                if not await self._after_exit(child, proc.returncode):
                    return

    async def _after_exit(self, child: Child, code: int) -> bool:
        """`child` exited with `code`: restarted (True), or, when it refused its configuration, the refusal
        said and the platform told to stop (False)."""
        if child.pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.pump, 2)
        child.exit_code, child.last_error = code, last_words(child.last_line)
        if code == EXIT_REFUSED:
            reason = child.last_line.rpartition("refuses to start: ")[2] or child.last_line
            self.refusal = f"{child.name} refused its configuration: {reason}"
            child.state = ProcessState.REFUSED
            self._report(child)
            self.refused.set()
            return False
        await self._restart_after_crash(child, code)
        return True

    async def _restart_after_crash(self, child: Child, code: int) -> None:
        """Start `child` again after its backoff (doubled at each exit, back to 1 s after STABLE_SECONDS of
        running), said a crash loop after CRASH_LOOP quick exits in a row."""
        if time.monotonic() - child.started > STABLE_SECONDS:
            child.backoff, child.quick_exits = 1.0, 0
        else:
            child.quick_exits += 1
        child.restarts += 1
        looping = child.quick_exits >= CRASH_LOOP
        child.state = ProcessState.CRASH_LOOPING if looping else ProcessState.RESTARTING
        self._report(child)
        said = (
            f"; crash-looping ({child.quick_exits} exits in a row within {STABLE_SECONDS:.0f}s of "
            f"starting), last said: {escape(child.last_line)}"
            if looping
            else ""
        )
        self.say(
            child.name,
            f"[bold red]exited with code {code}; restarting in {child.backoff:.0f}s "
            f"(restart #{child.restarts}){said}[/]",
        )
        await asyncio.sleep(child.backoff)
        child.backoff = min(child.backoff * 2, LONGEST_BACKOFF)
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
            if all(c.ready for c in self.children.values() if not is_nats(c)) and await asyncio.to_thread(
                healthy
            ):
                return True
            if time.monotonic() > deadline:
                waiting = ", ".join(c.name for c in self.children.values() if not is_nats(c) and not c.ready)
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
        services = [n for n in order if n in self.children and not is_nats(self.children[n])]
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
        if child and child.proc and not await exited(child.proc, grace):
            self.say(name, "did not stop in time; killing it")
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            await exited(child.proc, grace)
        if child and child.pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.pump, 2)

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


def is_nats(child: Child) -> bool:
    """Whether `child` is a NATS server (`nats`, or `nats-2`… of a clustered bus), not a service."""
    return (child.service or child.name) == "nats"


async def exited(proc: asyncio.subprocess.Process, within: float) -> bool:
    """Whether `proc` exits within `within` seconds (its status is known: its pipes may still be open)."""
    deadline = time.monotonic() + within
    while proc.returncode is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(STOP_POLL_SECONDS)
    return True
