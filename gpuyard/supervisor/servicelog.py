"""A service process's output as `gpuyard up` keeps it: its log file (`ServiceLog`), which a full disk never
lets hold the process up, and its lines as the console shows them (`shorten`)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape

from gpuyard.shared.contracts.units import format_size

LOG_RETRY_SECONDS = 5.0
"""How long a supervisor that could not write a process's log file drops its output before it tries again."""
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


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
        write: Callable[[int, memoryview], int] = os.write,
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


def shorten(text: str, name: str) -> str:
    """Drop the timestamp and service name the service put in its own log line; the prefix says it."""
    parts = text.split(" ", 3)
    if len(parts) == 4 and parts[2] == name:
        return parts[3]
    return text
