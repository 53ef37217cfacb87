"""What the reaper reads of /proc (a process's start time, its own children, what waits in a pipe) and of the
replicas' files, and how it writes the pid and exit files (whole, or not at all). Standard library only (see
`__init__.py`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import struct
import termios


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (a zombie's too); None if it is gone."""
    try:  # (os.open and os.read: no file object to make, once per replica started)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096).decode()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def write_atomically(path: str, doc: dict) -> None:
    """`path` holds `doc` whole, or (an OSError: a full disk) is left as it was, without a partial file."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            data = json.dumps(doc).encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        finally:
            os.close(fd)
        os.rename(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def children() -> set[int]:
    """This process's children, from /proc (each thread's list; the reaper has one thread)."""
    found: set[int] = set()
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            found.update(int(p) for p in f.read().split())
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: scan every process's parent
        me = os.getpid()
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        stat = f.read().decode()
                except OSError:
                    continue
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                    found.add(int(name))
    return found


def unread(fd: int) -> int:
    """Bytes waiting in a pipe."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def read_elsewhere(exit_file: str) -> bool:
    """Whether a live executor that adopted the replica reads its output (its pid in `replica-<r>.reader`):
    then the rest of the output is that executor's to read, to the pipe's end, not the reaper's to take."""
    try:
        with open(exit_file.removesuffix(".exit") + ".reader") as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True
