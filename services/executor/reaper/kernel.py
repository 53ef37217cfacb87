"""The Linux calls the reaper and a replica's first process make through libc (ctypes): becoming a child
subreaper, and a mount namespace of the replica's own, with folders bound in it, some read-only. Standard library
only (see `__init__.py`)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 0x20, 0x1000, 0x4000, 0x80000
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
"""What a read-only remount keeps of a bound folder's mount (statvfs's ST_ flags have the same values)."""

_libc = ctypes.CDLL(None, use_errno=True)


def _checked(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def subreaper() -> None:
    """The calling process becomes a child subreaper: its orphaned descendants are re-parented to it."""
    _checked(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))


def private_mounts(binds: list[list[str]], hide_pids: bool, read_only: Sequence[str] = ()) -> None:
    """A mount namespace of the calling process's own (it is root): mounts of the host still reach it (slave),
    none of its own goes back; each `[source, target]` bound over its target, then each of `read_only` (targets
    of those) remounted read-only, keeping its nosuid, nodev and noexec (a write there fails with EROFS), then,
    with `hide_pids`, a proc of its own on /proc that shows only its user's processes. As replica_start.c's
    `private_mounts`."""
    _checked(_libc.unshare(CLONE_NEWNS))
    _checked(_libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None))
    for source, target in binds:
        _checked(_libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND | MS_REC, None))
    for target in read_only:
        kept = os.statvfs(target).f_flag & KEPT_FLAGS
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | kept
        _checked(_libc.mount(None, os.fsencode(target), None, flags, None))
    if hide_pids:
        _checked(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2"))
