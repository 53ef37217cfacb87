"""An upload written to a local file as it comes (never held in memory whole): what the model store stages a
model in (`modelfiles/store.py`) and a volume in a folder stages an upload in (`services/submit/volumefolders.py`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.splice import SPLICE, splice_exactly
from gpuyard.shared.runtime.writeback import WriteBack


class OverQuota(Exception):
    """An upload that does not fit in the room it was given; the message says how much was left (HTTP 413)."""


def over_quota(room: int) -> OverQuota:
    return OverQuota(f"the upload does not fit: the volume has {format_size(room)} left")


class UploadFile:
    """An upload being written to its file in `folder` (`write` each chunk, blocking: from a thread), refused
    past `room` bytes (None: no limit; `OverQuota`), hashed on the way when `hashed` (`sha256`); `close`
    flushes it to disk (its write-back started as it was written: `WriteBack`); `discard` removes it whatever
    happened."""

    def __init__(self, folder: Path, room: int | None = None, *, hashed: bool = False):
        self.path = folder / f"{uuid.uuid4().hex}.part"
        self.room = room
        self.size = 0
        self._hash = hashlib.sha256() if hashed else None
        self._file = os.fdopen(
            os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb", buffering=0
        )
        self._writeback = WriteBack(self._file.fileno())

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest() if self._hash is not None else ""

    def write(self, chunk: bytes | bytearray) -> None:
        self.size += len(chunk)
        if self.room is not None and self.size > self.room:
            raise over_quota(self.room)
        view = memoryview(chunk)
        while view:  # (unbuffered: a write may take part of it)
            view = view[self._file.write(view) :]
        self._writeback.wrote(len(chunk))
        if self._hash is not None:
            self._hash.update(chunk)

    @property
    def spliceable(self) -> bool:
        """Whether `splice_from` can take the bytes: the kernel splices here, and nothing needs to read them
        (no hash)."""
        return SPLICE and self._hash is None

    def splice_from(self, source: int, count: int, readable: Callable[[], None] | None = None) -> None:
        """`count` bytes of the socket `source` written as `write` writes them, but moved by the kernel
        (`shared/runtime/splice.py`); refused before a byte moves when they do not fit. OSError for a socket that
        ends first."""
        if self.room is not None and self.size + count > self.room:
            raise over_quota(self.room)

        def moved(n: int) -> None:
            self.size += n
            self._writeback.wrote(n)

        splice_exactly(source, self._file.fileno(), count, moved, readable)

    def close(self) -> None:
        """Flushed to disk (fsync) and closed: whole once this returns."""
        os.fsync(self._file.fileno())
        self._file.close()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
