"""The batch jobs' exit files, seen as they are written: inotify on the attempts' spool folders wakes the backend's
look at the exit files at once, instead of at its next `exit_check_interval`.

inotify sees only what is written through this host's kernel: where the spool folder is a shared filesystem
(NFS) and the batch jobs run on other nodes, it sees nothing, and the looks every `exit_check_interval` find the
ends as before. Where inotify cannot be had (not Linux, no watches left), the watch stays silent, likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct

log = logging.getLogger(__name__)
IN_MOVED_TO = 0x00000080
"""The batch script writes `<replica>.exit.part`, then renames it to `<replica>.exit`."""
IN_Q_OVERFLOW = 0x00004000
"""Events were lost: whatever they were, a look finds it."""
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
EVENT = struct.Struct("iIII")
"""struct inotify_event: wd, mask, cookie, len (then the name, `len` bytes)."""
EXIT_SUFFIX = b".exit"


class ExitWatch:
    """Sets `written` when an exit file appears in a watched folder (the caller clears it and looks)."""

    def __init__(self) -> None:
        self.written = asyncio.Event()
        self.fd = -1
        self.folders: dict[str, int] = {}
        """Folder → its watch descriptor."""
        self._libc: ctypes.CDLL | None = None

    def open(self) -> None:
        """Start watching (on the running event loop); a host without inotify keeps the polling alone."""
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError) as exc:
            log.info("exit files looked at every interval only: no inotify (%s)", exc)
            return
        if fd < 0:
            log.info("exit files looked at every interval only: %s", os.strerror(ctypes.get_errno()))
            return
        self._libc, self.fd = libc, fd
        asyncio.get_running_loop().add_reader(fd, self._read)

    def watch(self, folder: str) -> None:
        """Watch a folder the batch jobs write their exit files in (again: nothing more)."""
        if self._libc is None or folder in self.folders:
            return
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), IN_MOVED_TO)
        if wd < 0:  # (no watches left: its ends are found by the looks every interval)
            log.debug("cannot watch %s: %s", folder, os.strerror(ctypes.get_errno()))
            return
        self.folders[folder] = wd

    def forget(self, folder: str) -> None:
        wd = self.folders.pop(folder, None)
        if wd is not None and self._libc is not None:
            self._libc.inotify_rm_watch(self.fd, wd)  # (fails harmlessly when the folder is gone already)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        offset = 0
        while offset + EVENT.size <= len(data):
            _wd, mask, _cookie, size = EVENT.unpack_from(data, offset)
            name = data[offset + EVENT.size : offset + EVENT.size + size].rstrip(b"\0")
            offset += EVENT.size + size
            if name.endswith(EXIT_SUFFIX) or mask & IN_Q_OVERFLOW:
                self.written.set()

    def close(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(RuntimeError):  # (its loop closed already)
            asyncio.get_running_loop().remove_reader(self.fd)
        os.close(self.fd)
        self.fd, self._libc = -1, None
        self.folders.clear()
