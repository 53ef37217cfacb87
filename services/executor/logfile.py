"""A replica's log on disk: size-capped, rotated, and the one definition of how its files are named.

One attempt of one replica writes `replica-<r>.log`; when that file reaches `max_bytes` it becomes
`replica-<r>.log.1` (the previous `.1` becomes `.2`, …) and a new `replica-<r>.log` starts. At most `backups`
rotated files are kept; older output is deleted, so a replica never holds more than
`max_bytes * (backups + 1)` bytes of log. The names are defined once, in `shared.paths` (`backup_path`,
`log_files`), which readers such as the submit API use too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from pathlib import Path

from shared.logstore import LogKey
from shared.logstore.shipper import LogShipper
from shared.paths import backup_path, log_files, private_dir

log = logging.getLogger(__name__)
READ_CHUNK = 256 * 1024


def tail_lines(path: Path, lines: int = 20) -> list[str]:
    """The last `lines` lines of a log, across a rotation."""
    found: deque[str] = deque(maxlen=lines)
    for file in log_files(path)[-2:]:
        with file.open("r", errors="replace") as f:
            found.extend(line.rstrip("\n") for line in f)
    return list(found)


def output_after(path: Path, offset: int, most: int) -> tuple[int, bytes]:
    """A replica's output from byte `offset` on (counted from its first byte, across its rotated files), at
    most its last `most` bytes: (where what is returned begins, the bytes)."""
    files = log_files(path)
    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    begin = max(offset, total - most)
    if begin >= total:
        return total, b""
    parts, position = [], total
    for file, size in zip(reversed(files), reversed(sizes), strict=True):
        position -= size
        if position + size <= begin:
            break
        with file.open("rb") as f:
            f.seek(max(begin - position, 0))
            parts.append(f.read(size - max(begin - position, 0)))
    return begin, b"".join(reversed(parts))


class RotatingLog:
    """Appends bytes to a log, rotating it at `max_bytes` (0: never). Unbuffered: readers on this node see
    every write. With a `shipper`, the same bytes also go to the log store under `key`, where the API reads
    them from any node."""

    def __init__(
        self,
        path: Path | str,
        max_bytes: int,
        backups: int,
        *,
        shipper: LogShipper | None = None,
        key: LogKey | None = None,
    ):
        if max_bytes < 0 or backups < 0:
            raise ValueError("log size and number of backups cannot be negative")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        try:
            self.fd = self._open()
        except FileNotFoundError:  # its folder is made only when missing (a stat and a mkdir saved per log)
            private_dir(os.path.dirname(path))
            self.fd = self._open()
        self.size = os.fstat(self.fd).st_size
        self.written = 0
        """Bytes written through this object (rotations included)."""
        self.shipper = shipper if key is not None else None
        self.key = key
        if self.shipper is not None:
            # a log written before (an executor restarted while its replica ran) goes on at its whole size
            before = sum(os.path.getsize(f) for f in log_files(Path(path))) if self.size else 0
            self.shipper.open(key, before)

    def write(self, data: bytes) -> None:
        """Append `data`; a file is rotated at a line's end where it can be (a longer line is split)."""
        if self.shipper is not None:
            self.shipper.write(self.key, data)
        view = memoryview(data)
        while view:
            if self.max_bytes and self.size >= self.max_bytes:
                self.rotate()
            room = self.max_bytes - self.size if self.max_bytes else len(view)
            if len(view) <= room:
                self._write_all(view)
                return
            cut = bytes(view[:room]).rfind(b"\n") + 1
            if cut == 0:
                if self.size > 0:
                    self.rotate()
                    continue
                cut = room
            self._write_all(view[:cut])
            view = view[cut:]

    def _write_all(self, chunk: memoryview) -> None:
        while chunk:
            n = os.write(self.fd, chunk)
            self.size += n
            self.written += n
            chunk = chunk[n:]

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def rotate(self) -> None:
        os.close(self.fd)
        path = Path(self.path)
        if self.backups == 0:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        else:
            with contextlib.suppress(FileNotFoundError):
                backup_path(path, self.backups).unlink()
            for n in range(self.backups - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    backup_path(path, n).rename(backup_path(path, n + 1))
            path.rename(backup_path(path, 1))
        self.fd = self._open()
        self.size = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.shipper is not None:
            self.shipper.close(self.key)


class LogPump:
    """Copies a replica's output pipe into its rotating log file.

    The pipe's read end is a plain reader of the event loop, closed right after it is unregistered (a pipe
    transport of uvloop closes its descriptor first and leaves it registered until a later turn of the loop:
    a new pipe given that number meanwhile could not be watched)."""

    def __init__(self, fd: int, sink: RotatingLog):
        self.fd = fd
        self.sink = sink
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future = self.loop.create_future()
        os.set_blocking(fd, False)
        self.loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("cannot read the output of %s: %s", self.sink.path, exc)
            data = b""
        if not data:  # every writer has closed it: the replica and whatever it started are gone
            self.close()
            return
        try:
            self.sink.write(data)
        except OSError as exc:  # a full disk must not take the executor down; the job goes on
            log.warning("cannot write log %s: %s", self.sink.path, exc)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self.done.done():
            self.done.set_result(None)
