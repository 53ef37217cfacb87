"""Starting the kernel's write-back of a file's bytes as they are written, so that the fsync that makes the file
whole finds little left to write (Linux's `sync_file_range(SYNC_FILE_RANGE_WRITE)`; the same as the page cache
would do later, started now). A no-op where the call is missing."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

SYNC_FILE_RANGE_WRITE = 2
EVERY = 16 << 20
"""Bytes written between two write-back starts."""


def _sync_file_range():
    if not hasattr(os, "sched_getaffinity"):  # (not Linux)
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_CALL = _sync_file_range()


class WriteBack:
    """Tracks how much of a file was written (`wrote(n)`) and starts the write-back of each `EVERY` bytes."""

    def __init__(self, fd: int):
        self.fd = fd
        self.started = 0
        self.written = 0

    def wrote(self, n: int) -> None:
        self.written += n
        if _CALL is not None and self.written - self.started >= EVERY:
            _CALL(self.fd, self.started, self.written - self.started, SYNC_FILE_RANGE_WRITE)
            self.started = self.written
