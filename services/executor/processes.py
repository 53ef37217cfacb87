"""A replica's processes: signalling and stopping a process group, stopping what an earlier executor left
running (found through its pid files), and what this node can hide from them (`Namespaces`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuyard.services.executor.cgroups import Cgroups
from gpuyard.services.executor.pidfiles import PidRecord
from gpuyard.shared.contracts.events.jobs import FailureReason


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


# ---------------------------------------------------------------- what a replica sees of the node

HIDEPID_KERNEL = (5, 8)
"""From Linux 5.8 each mount of proc is an instance of its own: hidepid on a job's proc leaves the node's
/proc as it is. Before, the option belonged to the PID namespace: mounting it would hide the processes of
every other user on the whole node, so it is not done."""
PROBE_SECONDS = 10
PROBE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(step, result):
    if result != 0:
        sys.exit(f"{step}: {os.strerror(ctypes.get_errno())}")
source, target, hide = sys.argv[1:]
check("unshare", libc.unshare(0x20000))
check("mount", libc.mount(None, b"/", None, 0x4000 | 0x80000, None))
check("bind", libc.mount(source.encode(), target.encode(), None, 0x1000 | 0x4000, None))
if hide == "1":
    check("proc", libc.mount(b"proc", target.encode(), b"proc", 0x2 | 0x4 | 0x8, b"hidepid=2"))
"""
"""A child that tries what a replica's start does in a mount namespace of its own (on folders of its own):
the node's mounts are not touched, whatever it manages."""


@dataclass(frozen=True)
class Namespaces:
    """What this node can give a replica that runs as another user than the platform's: a mount namespace of
    its own (private /tmp, /var/tmp and /dev/shm), and a proc on its /proc that shows only its user's
    processes (hidepid=2). `reason`: why not, in plain words."""

    mounts: bool
    hide_pids: bool
    reason: str = ""


def kernel_at_least(version: tuple[int, int], release: str | None = None) -> bool:
    release = os.uname().release if release is None else release
    try:
        found = tuple(int(part) for part in release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= version


def probe_namespaces() -> Namespaces:
    """Whether the node lets the platform (root) make a replica's mount namespace, found by trying it in a
    child process; the start of a replica then does the same before it leaves root."""
    if os.geteuid() != 0:
        return Namespaces(False, False, "the platform is not root")
    hidepid = kernel_at_least(HIDEPID_KERNEL)
    reason = "" if hidepid else f"Linux {os.uname().release}: hidepid would hide processes node-wide"
    for hide in (hidepid, False) if hidepid else (False,):
        try:
            with tempfile.TemporaryDirectory(prefix="gpuyard-probe-") as folder:
                source, target = os.path.join(folder, "source"), os.path.join(folder, "target")
                os.mkdir(source)
                os.mkdir(target)  # (its mounts end with the child's namespace, the folders here)
                done = subprocess.run(
                    [sys.executable, "-I", "-S", "-c", PROBE, source, target, "1" if hide else "0"],
                    capture_output=True,
                    text=True,
                    timeout=PROBE_SECONDS,
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Namespaces(False, False, f"no mount namespace could be tried: {exc}")
        if done.returncode == 0:
            return Namespaces(True, hide, reason)
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        reason = f"no {'proc with hidepid' if hide else 'mount namespace'} here ({reason})"
    return Namespaces(False, False, reason)


def under(path: str | os.PathLike, folders: tuple[str, ...]) -> str | None:
    """The first of `folders` that `path` is in (or is), as the kernel resolves it; None if none."""
    resolved = os.path.realpath(path)
    for folder in folders:
        real = os.path.realpath(folder)
        if resolved == real or resolved.startswith(real.rstrip("/") + "/"):
            return folder
    return None
