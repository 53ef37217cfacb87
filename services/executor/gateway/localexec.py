"""A command run beside a replica of the local backend: in its working directory, with its environment (its GPUs,
ranks and tokens), as its user (the tenant's, when the platform runs as root), in its cgroup (its CPU and memory
limits) and its mount namespace (its private /tmp and volumes), in a session of its own; with a terminal (a pty
that is its controlling terminal) or with pipes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import pty
import shutil
import signal
import struct
import termios
from collections.abc import Callable
from pathlib import Path

from gpuyard.services.executor.gateway.process import ExecProcess, Send
from gpuyard.services.executor.gateway.replicas import NoReplica, ReplicaProcess
from gpuyard.services.executor.processes import not_found, signal_group
from gpuyard.services.executor.reaper.kernel import CLONE_NEWNS, _checked, _libc
from gpuyard.shared.contracts.api.access import STDERR, STDOUT, ExecStart, exit_code

CHUNK = 64 * 1024
PR_SET_PDEATHSIG = 1
KILL_GRACE = 2.0
SHELLS = ("/bin/bash", "/bin/sh")


def shell_argv(env: dict[str, str]) -> list[str]:
    """A terminal's command when none is given: the replica's $SHELL, else bash, else sh (not a login shell,
    which would reset the job's PATH)."""
    for shell in (env.get("SHELL", ""), *SHELLS):
        if shell and os.path.isabs(shell) and os.access(shell, os.X_OK):
            return [shell]
    return ["sh"]


def entering(
    target: ReplicaProcess, *, ns_fd: int | None, cgroup_fd: int | None
) -> Callable[[int | None], None]:
    """What the command's process does between fork and exec: a session of its own, into the replica's cgroup
    and mount namespace, its terminal (`tty_fd`) as controlling terminal, the replica's user, its working
    directory. Only system calls: the executor's threads hold no lock the child needs. (The descriptors it
    uses are the parent's, kept open: an event loop's spawn may set up the child's 0, 1, 2 after it.)"""
    switch = os.geteuid() == 0 and target.uid != 0

    def enter(tty_fd: int | None) -> None:
        with contextlib.suppress(OSError):  # (already its session's leader)
            os.setsid()
        if cgroup_fd is not None:
            with contextlib.suppress(OSError):  # (a cgroup removed meanwhile: the replica has ended)
                os.write(cgroup_fd, b"0")
        if ns_fd is not None:
            _checked(_libc.setns(ns_fd, CLONE_NEWNS))
        if tty_fd is not None:
            fcntl.ioctl(tty_fd, termios.TIOCSCTTY, 0)
        if switch:
            os.setgroups(list(target.groups))
            os.setresgid(target.gid, target.gid, target.gid)
            os.setresuid(target.uid, target.uid, target.uid)
        # it ends with the executor, were the executor to end first (set after the switch, which clears it)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(target.cwd)

    return enter


def _open_cgroup(cgroup: str | None) -> int | None:
    if not cgroup:
        return None
    try:
        return os.open(Path(cgroup) / "cgroup.procs", os.O_WRONLY)
    except OSError:
        return None  # (no cgroups here, or gone: the command runs outside, as a replica would without)


def _open_ns(target: ReplicaProcess) -> int | None:
    if target.mount_ns is None:
        return None
    if os.geteuid() != 0:
        raise NoReplica(
            409, "the replica has a mount namespace of its own, which only a root executor enters"
        )
    return os.open(target.mount_ns, os.O_RDONLY)


def check_user(target: ReplicaProcess) -> None:
    if os.geteuid() != 0 and target.uid != os.getuid():
        raise NoReplica(409, "the replica runs as another user, and this executor is not root")


async def start_local(target: ReplicaProcess, start: ExecStart, *, tty: bool) -> ExecProcess:
    """Start the command (`start.argv`, or a shell) beside `target`; NoReplica when it cannot be."""
    check_user(target)
    env = dict(target.env)
    argv = start.argv or shell_argv(env)
    if tty:
        env["TERM"] = start.term
    ns_fd = _open_ns(target)
    cgroup_fd = _open_cgroup(target.cgroup)
    try:
        enter = entering(target, ns_fd=ns_fd, cgroup_fd=cgroup_fd)
        kept = tuple(fd for fd in (ns_fd, cgroup_fd) if fd is not None)
        if "/" not in argv[0] and shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise NoReplica(404, not_found(argv[0]))
        if tty:
            return await PtyProcess.start(argv, env, enter, kept, start.size, target)
        return await PipeProcess.start(argv, env, enter, kept, target, stdin=start.stdin)
    except (OSError, ValueError) as exc:  # (subprocess's own error for a step before exec)
        raise NoReplica(409, f"cannot start {argv[0]}: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        for fd in (ns_fd, cgroup_fd):
            if fd is not None:
                os.close(fd)


class LocalProcess(ExecProcess):
    def __init__(self, proc: asyncio.subprocess.Process, target: ReplicaProcess):
        self.proc = proc
        self.target = target

    async def wait(self) -> int:
        return exit_code(await self.proc.wait())

    async def kill(self) -> None:
        signal_group(self.proc.pid, signal.SIGHUP)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), KILL_GRACE)
        signal_group(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()

    def replica_alive(self) -> bool:
        return self.target.alive()


class PipeProcess(LocalProcess):
    @classmethod
    async def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        enter: Callable[[int | None], None],
        kept: tuple[int, ...],
        target: ReplicaProcess,
        *,
        stdin: bool,
    ) -> PipeProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            pass_fds=kept,
            preexec_fn=lambda: enter(None),  # noqa: PLW1509 (system calls only: see `entering`)
        )
        return cls(proc, target)

    async def pump_output(self, send: Send) -> None:
        async def pump(stream: asyncio.StreamReader, number: int) -> None:
            while data := await stream.read(CHUNK):
                await send(number, data)

        assert self.proc.stdout is not None and self.proc.stderr is not None
        await asyncio.gather(pump(self.proc.stdout, STDOUT), pump(self.proc.stderr, STDERR))

    async def write(self, data: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdin.is_closing():
            return
        self.proc.stdin.write(data)
        with contextlib.suppress(ConnectionError):
            await self.proc.stdin.drain()

    async def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def resize(self, cols: int, rows: int) -> None:
        return None


def window_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyProcess(LocalProcess):
    def __init__(self, proc: asyncio.subprocess.Process, target: ReplicaProcess, master: int):
        super().__init__(proc, target)
        self.master = master

    @classmethod
    async def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        enter: Callable[[int | None], None],
        kept: tuple[int, ...],
        size: tuple[int, int],
        target: ReplicaProcess,
    ) -> PtyProcess:
        master, slave = pty.openpty()
        try:
            window_size(slave, *size)
            if os.geteuid() == 0 and target.uid != 0:
                os.fchown(slave, target.uid, -1)  # (its terminal is its own, as a login's is)
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                pass_fds=(*kept, slave),
                preexec_fn=lambda: enter(slave),  # noqa: PLW1509 (system calls only: see `entering`)
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        return cls(proc, target, master)

    async def _ready(self, add: Callable, remove: Callable) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        add(self.master, wake)
        try:
            await ready
        finally:
            remove(self.master)

    async def pump_output(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = os.read(self.master, CHUNK)
            except BlockingIOError:
                await self._ready(loop.add_reader, loop.remove_reader)
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:  # (every process holding the terminal has closed it)
                    return
                raise
            if not data:
                return
            await send(STDOUT, data)

    async def write(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        while data:
            try:
                written = os.write(self.master, data)
            except BlockingIOError:
                await self._ready(loop.add_writer, loop.remove_writer)
                continue
            except OSError:
                return  # (its terminal is closed: it has ended)
            data = data[written:]

    async def close_stdin(self) -> None:
        await self.write(b"\x04")  # (a terminal's end of input: Ctrl-D)

    def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(OSError):
            window_size(self.master, cols, rows)

    async def kill(self) -> None:
        try:
            await super().kill()
        finally:
            self.close()

    def close(self) -> None:
        if self.master >= 0:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = -1
