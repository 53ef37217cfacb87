"""The executor's side of its reaper (`reaper/`): start the reaper, have it start replicas, learn their ends;
and, after a restart, watch a replica an earlier executor's reaper started, until its exit file says how it
ended.

A start is one message each way over a socket pair: no thread, no fork of the executor. The reaper's answer
comes in order; each end comes as its own message once the reaper has written the replica's exit file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)
REAPER = str(Path(__file__).with_name("reaper") / "__main__.py")
"""The reaper's entry, run as a file by `python -I -S` (`reaper/__main__.py`)."""
MAX_MESSAGE = 64 * 1024
EXIT_FILE_WAIT = 5.0
"""Seconds an adopted replica's exit file may take to appear once its process has ended (its reaper writes it
after reaping it)."""


class ReaperGone(Exception):
    """The reaper ended (or could not start): replicas can no longer be started or watched by this executor."""


class StartRefused(OSError):
    """The replica could not be started; `step` says where: folders, cgroup, namespace, user, cwd, exec,
    pid_file."""

    def __init__(self, code: int, step: str, message: str):
        super().__init__(code, message)
        self.step = step


class ReapedProcess:
    """A replica's first process, started by a reaper: `wait()` gives its exit status (negative: the signal
    that killed it), or None when that status was lost (its reaper ended before writing it)."""

    def __init__(self, pid: int, start: int | None):
        self.pid = pid
        self.start = start
        self.returncode: int | None = None
        self.ended = False
        self._exited: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    def exited(self, status: int | None) -> None:
        if not self._exited.done():
            self.returncode, self.ended = status, True
            self._exited.set_result(status)

    async def wait(self) -> int | None:
        return await asyncio.shield(self._exited)


def read_exit_file(path: str) -> int | None:
    """The status a reaper wrote for a replica; None if there is none (yet)."""
    try:
        with open(path, "rb") as f:
            return int(json.loads(f.read())["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ReaperClient:
    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.answers: deque[asyncio.Future] = deque()
        self.running: dict[int, ReapedProcess] = {}
        self.gone: asyncio.Future[None] | None = None
        self.closing = False

    def open(self, helper: str | None = None) -> None:
        """Start the reaper (a process in its own session, so that nothing aimed at the executor reaches it),
        with the start helper's path where there is one (start_helper.py)."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(os.devnull, "rb") as null:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", REAPER, str(theirs.fileno()), *([helper] if helper else [])],
                    stdin=null,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
        except OSError as exc:
            ours.close()
            raise ReaperGone(f"cannot start the reaper: {exc}") from None
        finally:
            theirs.close()
        self.proc.returncode = 0  # never waited for by Popen itself: the executor does not own its end
        ours.setblocking(False)
        self.sock = ours
        self.gone = loop.create_future()
        loop.add_reader(ours.fileno(), self._readable, ours)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    async def start(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        output: tuple[int, int],
        pid_file: str,
        exit_file: str,
        log_file: str,
        record: dict,
        user: tuple[int, int] | None = None,
        cgroup: str | None = None,
        folders: Sequence[Sequence] = (),
        binds: Sequence[tuple[str, str]] = (),
        read_only: Sequence[str] = (),
        hide_pids: bool = False,
    ) -> ReapedProcess:
        """Start a replica; `output` is its pipe (write end for the replica, read end for the reaper to hold);
        `folders` ([path, mode, uid, gid]) made by its first process first (`reaper/folders.py`); `binds`
        (source, target), `read_only` (targets of those) and `hide_pids`: a mount namespace of its own
        (`reaper/kernel.py`, `private_mounts`). Raises StartRefused (with the step) or ReaperGone."""
        if self.sock is None or self.gone is None or self.gone.done():
            raise ReaperGone("the reaper has ended")
        request = dict(
            argv=list(argv),
            cwd=cwd,
            env=dict(env),
            pid_file=pid_file,
            exit_file=exit_file,
            log_file=log_file,
            record=record,
            user=list(user) if user else None,
            cgroup=cgroup,
            folders=[list(folder) for folder in folders] or None,
            binds=[list(pair) for pair in binds] or None,
            read_only=list(read_only) or None,
            hide_pids=hide_pids,
        )
        data = json.dumps(request).encode("utf-8", "surrogateescape")
        answer = asyncio.get_running_loop().create_future()
        await self._send(self.sock, self.gone, data, list(output))
        self.answers.append(answer)
        return await answer

    async def _send(
        self, sock: socket.socket, gone: asyncio.Future[None], data: bytes, fds: list[int]
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                socket.send_fds(sock, [data], fds)
                return
            except BlockingIOError:
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(sock.fileno(), _resolve, writable)
                try:
                    await asyncio.wait([writable, gone], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    loop.remove_writer(sock.fileno())
                if gone.done():
                    raise ReaperGone("the reaper has ended") from None
            except OSError as exc:
                if exc.errno == 90:  # EMSGSIZE
                    raise StartRefused(
                        exc.errno, "request", "its command and environment are too large"
                    ) from None
                self._lost()
                raise ReaperGone(f"the reaper has ended: {exc}") from None

    def _readable(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            message = json.loads(data)
            if "exited" in message:
                proc = self.running.pop(message["exited"], None)
                if proc is not None:
                    proc.exited(message["status"])
            elif self.answers:
                answer = self.answers.popleft()
                if "error" in message:
                    refused = StartRefused(
                        message["error"], message.get("step", ""), message.get("message", "")
                    )
                    if not answer.done():
                        answer.set_exception(refused)
                    continue
                # known at once: its end may come in the same read, before the start's caller resumes
                proc = self.running[message["pid"]] = ReapedProcess(message["pid"], message.get("start"))
                if not answer.done():
                    answer.set_result(proc)

    def _lost(self) -> None:
        if self.sock is None or self.gone is None or self.gone.done():
            return
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        if not self.closing:
            log.error("the reaper (pid %d) has ended: replicas' ends can no longer be learnt", self.pid)
        error = ReaperGone("the reaper has ended")
        while self.answers:
            answer = self.answers.popleft()
            if not answer.done():
                answer.set_exception(error)
        self.gone.set_result(None)

    async def until_gone(self) -> None:
        """Returns only when the reaper ended while the executor still needs it (raises ReaperGone then)."""
        if self.gone is None:
            raise RuntimeError("the reaper is watched once it has started (ReaperClient.open)")
        await asyncio.shield(self.gone)
        if not self.closing:
            raise ReaperGone(f"the executor's reaper (pid {self.pid}) ended")

    def close(self) -> None:
        """The executor stops: the reaper goes on until the replicas it started have ended."""
        self.closing = True
        if self.sock is not None:
            self._lost()
            self.sock.close()


async def watch_adopted(pid: int, start: int | None, exit_file: str) -> int | None:
    """Wait until a process an earlier executor's reaper started ends; its status from its exit file (None
    when none appears: its reaper ended before writing it)."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    else:
        from gpuyard.services.executor.processes import process_start_time

        if process_start_time(pid) != start:  # ended meanwhile, and the number may have been reused
            os.close(pidfd)
            pidfd = -1
    if pidfd >= 0:
        ended = loop.create_future()
        loop.add_reader(pidfd, _resolve, ended)
        try:
            await ended
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    for _ in range(int(EXIT_FILE_WAIT / 0.05)):
        status = read_exit_file(exit_file)
        if status is not None:
            return status
        await asyncio.sleep(0.05)
    return None


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
