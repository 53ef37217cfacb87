"""Reading job logs from the data directory (the executor writes them; logs never travel on the bus).

A replica's log may have been rotated (size cap, see services/executor/logfile.py): reading serves the
rotated files still kept, oldest first, then the live one; following keeps its open file across a rotation,
reads what is left in it, then goes on with the new live file from its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from shared.paths import log_files, log_path


def read_log(data_dir: Path, job_id: str, attempt: int, replica: int, tail: int | None) -> str:
    files = log_files(log_path(data_dir, job_id, attempt, replica))
    if tail:
        lines: deque[str] = deque(maxlen=tail)
        for file in _newest_enough(files, tail):
            with _open_text(file) as f:
                lines.extend(f)
        return "".join(lines)
    parts = []
    for file in files:
        with _open_text(file) as f:
            parts.append(f.read())
    return "".join(parts)


def _newest_enough(files: list[Path], lines: int) -> list[Path]:
    """The fewest newest files that hold at least `lines` lines (all of them when they hold fewer)."""
    chosen: list[Path] = []
    count = 0
    for file in reversed(files):
        chosen.insert(0, file)
        try:
            with file.open("rb") as f:
                count += sum(chunk.count(b"\n") for chunk in iter(lambda f=f: f.read(1 << 16), b""))
        except FileNotFoundError:
            continue
        if count > lines:
            break
    return chosen


def _open_text(path: Path):
    try:
        return path.open("r", errors="replace")
    except FileNotFoundError:  # rotated away while we read
        import io

        return io.StringIO("")


class _Follower:
    """Reads a log as it grows, across rotations of its live file."""

    def __init__(self, path: Path):
        self.path = path
        self.file: BinaryIO | None = None

    def open_live(self, offset: int) -> bool:
        try:
            self.file = self.path.open("rb")
        except FileNotFoundError:
            return False
        self.file.seek(offset)
        return True

    def read(self) -> bytes:
        """Everything new: the rest of the open file and, after rotations, the newer files in order."""
        if self.file is None and not self.open_live(0):
            return b""
        chunks = [self.file.read()]
        while (newer := self._next_file()) is not None:
            chunks.append(self.file.read())  # written between the read above and the rotation
            self.file.close()
            self.file = newer
            chunks.append(self.file.read())
        return b"".join(chunks)

    def _next_file(self) -> BinaryIO | None:
        """The file written after the open one, once that one was rotated (None while it is the live one).
        If the cap deleted files in between, the oldest one kept: their output is gone."""
        for _ in range(5):  # a rotation while we look renames the files: look again
            try:
                live = os.stat(self.path)
            except FileNotFoundError:
                return None
            mine = os.fstat(self.file.fileno()).st_ino
            if live.st_ino == mine:
                return None
            kept = []
            for file in log_files(self.path):
                with contextlib.suppress(FileNotFoundError):
                    kept.append((os.stat(file).st_ino, file))
            inodes = [inode for inode, _ in kept]
            newer = kept[inodes.index(mine) + 1 :] if mine in inodes else kept
            if not newer:
                continue
            inode, file = newer[0]
            try:
                handle = file.open("rb")
            except FileNotFoundError:
                continue
            if os.fstat(handle.fileno()).st_ino == inode:
                return handle
            handle.close()
        return None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _history(path: Path, follower: _Follower) -> bytes:
    """The rotated files (older output) not being followed, oldest first."""
    skip = os.fstat(follower.file.fileno()).st_ino if follower.file else None
    parts = []
    for file in log_files(path)[:-1] if path.exists() else log_files(path):
        try:
            with file.open("rb") as f:
                if os.fstat(f.fileno()).st_ino != skip:
                    parts.append(f.read())
        except FileNotFoundError:
            continue
    return b"".join(parts)


async def follow_log(
    data_dir: Path,
    job_id: str,
    attempt: int,
    replica: int,
    tail: int | None,
    finished: Callable[[], Awaitable[bool]],
    poll: float = 0.25,
) -> AsyncIterator[bytes]:
    path = log_path(data_dir, job_id, attempt, replica)
    follower = _Follower(path)
    try:
        if tail:
            text = await asyncio.to_thread(read_log, data_dir, job_id, attempt, replica, tail)
            yield text.encode()
            size = path.stat().st_size if path.exists() else 0
            follower.open_live(size)
        else:
            follower.open_live(0)
            history = await asyncio.to_thread(_history, path, follower)
            if history:
                yield history
        while True:
            done = await finished()  # read before the file: the last bytes are written before the job ends
            chunk = await asyncio.to_thread(follower.read)
            if chunk:
                yield chunk
            if done:
                return
            await asyncio.sleep(poll)
    finally:
        follower.close()
