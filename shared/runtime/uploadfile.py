"""An upload written to a local file as it comes (never held in memory whole): what the model store stages a
model in (`modelfiles/store.py`) and a volume in a folder stages an upload in (`services/submit/volumefolders.py`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path

from gpuyard.shared.contracts.units import format_size
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

    def close(self) -> None:
        """Flushed to disk (fsync) and closed: whole once this returns."""
        os.fsync(self._file.fileno())
        self._file.close()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
