"""Start a replica's process and learn when it ends, without a thread per child or a fork of the executor.

posix_spawn (`spawn.py`), or `subprocess.Popen` where it is not available, starts the process with vfork
(the executor's memory is not copied, so a start costs a fraction of a millisecond whatever the executor's
size; uvloop's own spawn forks and copies it, several ms for a 100 MB executor), and a pidfd in the event loop
says when it exits (asyncio on Python 3.11 would otherwise wait for each child on a thread of its own).
Where pidfds are not available (not Linux, or refused by a sandbox), asyncio's own subprocess support is used.

vfork suspends the calling thread until the child has called exec, and on a busy machine the child first
waits for a CPU: 1.8 ms on average and 4.7 ms at p90 per start in a benchmark on two busy cores, for 0.3 ms
of the executor's own CPU. posix_spawn therefore runs on a small pool of spawning threads (`SPAWN_THREADS`),
and the event loop goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from services.executor.spawn import spawn

log = logging.getLogger(__name__)


class Process(Protocol):
    pid: int
    returncode: int | None

    async def wait(self) -> int: ...


def _pidfd_usable() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))  # refused in some sandboxes
    except OSError:
        return False
    return True


PIDFD = _pidfd_usable()
SPAWN_THREADS = 2
_spawner = ThreadPoolExecutor(max_workers=SPAWN_THREADS, thread_name_prefix="spawn")


class PidfdChild:
    """A started process whose exit the running event loop watches through a pidfd."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None):
        self.pid = pid
        self.returncode: int | None = None
        self._popen = popen  # (told the exit status, so that it never waits for the process itself)
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._pidfd = os.pidfd_open(pid)
        self._loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        try:
            _, status = os.waitpid(self.pid, 0)  # the pidfd is readable: it has exited, this does not block
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else: its status is lost
            log.warning("the exit status of process %d was taken by another waiter", self.pid)
            code = 255
        self.returncode = code
        if self._popen is not None:
            self._popen.returncode = code
        self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


async def start_child(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], output_fd: int) -> Process:
    """Start `argv` in a new session, stdin from /dev/null, stdout and stderr to `output_fd`. Raises
    OSError when it cannot be started (FileNotFoundError: no such command; PermissionError: not executable)."""
    options = dict(
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=output_fd,
        stderr=output_fd,
        start_new_session=True,
    )
    if not PIDFD:
        return await asyncio.create_subprocess_exec(*argv, **options)
    # both return once the exec is done, as asyncio's own spawn does inside the loop
    started = asyncio.get_running_loop().run_in_executor(
        _spawner, functools.partial(spawn, argv, cwd=cwd, env=env, output_fd=output_fd)
    )
    try:
        pid = await asyncio.shield(started)
    except asyncio.CancelledError:
        started.add_done_callback(_stop_orphan)  # started all the same: nobody would watch it
        raise
    if pid is not None:
        return PidfdChild(pid)
    popen = subprocess.Popen(list(argv), **options)  # noqa: ASYNC220
    return PidfdChild(popen.pid, popen)


def _stop_orphan(started: asyncio.Future) -> None:
    """A process started for a caller that was cancelled meanwhile: kill its group and reap it."""
    if started.cancelled() or started.exception() is not None or started.result() is None:
        return
    pid = started.result()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # killed: it ends at once
