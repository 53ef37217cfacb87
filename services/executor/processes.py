"""A replica's processes: signalling and stopping a process group, and stopping what an earlier executor left
running (found through its pid files)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Protocol

from services.executor.cgroups import Cgroups
from services.executor.pidfiles import PidRecord
from shared.events import FailureReason


class Process(Protocol):
    """A replica's first process: its pid, and its status once it has ended."""

    pid: int
    returncode: int | None

    async def wait(self) -> int | None: ...


class StartError(Exception):
    def __init__(self, reason: FailureReason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def signal_group(pid: int, sig: int) -> None:
    if pid <= 1:  # (0 or 1 would be the executor's own group, or every process)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def terminate(proc: Process, grace: float) -> None:
    """SIGTERM to the whole process group, SIGKILL after `grace` seconds."""
    if proc.returncode is not None or getattr(proc, "ended", False):
        signal_group(proc.pid, signal.SIGKILL)  # leftovers of the group
        return
    signal_group(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
    except TimeoutError:
        signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
    signal_group(proc.pid, signal.SIGKILL)


def not_found(argv0: str) -> str:
    return f"command not found: {argv0}" + ("" if "/" in argv0 else " (not in the PATH)")


def process_start_time(pid: int, *, zombie: bool = False) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone (or a
    zombie, unless `zombie`: ended, not yet reaped)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 4096).decode()
        finally:
            os.close(fd)
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z" and not zombie:
        return None  # a zombie: it has ended
    return int(fields[19])


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (scans /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(entry.name))
    return members


async def stop_leftovers(records: list[PidRecord], grace: float) -> int:
    """Stop what still runs of processes started by an earlier executor; how many groups were running."""
    running = 0
    for rec in records:
        alive = rec.start is not None and process_start_time(rec.pid) == rec.start
        members = [rec.pid] if alive else session_members(rec.pid)
        if members:
            running += 1
            signal_group(rec.pid, signal.SIGTERM)
            for _ in range(max(1, int(grace * 10))):
                if not session_members(rec.pid):
                    break
                await asyncio.sleep(0.1)
            signal_group(rec.pid, signal.SIGKILL)
            for pid in session_members(rec.pid):  # anything that left the group but not the session
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if rec.cgroup:
            Cgroups.kill(Path(rec.cgroup))
            Cgroups.remove(Path(rec.cgroup))
        with contextlib.suppress(OSError):
            rec.path.unlink()
    return running
