"""`gpuyard up` on a full disk: its copy of a service's output never holds the service up. A log file it cannot
write (ENOSPC) loses that output, which it says once, and it keeps reading the service's pipe; once the file can
be written again, a line in it says how much is missing. NATS saying that JetStream failed a write is restarted,
which heals its streams."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from gpuyard.supervisor import servicelog
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.natsserver import jetstream_broken
from gpuyard.supervisor.servicelog import ServiceLog
from gpuyard.supervisor.supervision import Supervisor

WITHIN = 60.0  # a generous bound on each wait: a slow machine only takes longer to get there


class Disk:
    """A writer for the supervisor's log files whose disk is full until `free` is set."""

    def __init__(self) -> None:
        self.full = True
        self.refused = 0

    def write(self, fd: int, data) -> int:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


async def until(check, what: str, within: float = WITHIN) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_log_that_cannot_be_written_drops_its_output_says_so_once_and_fills_the_gap_later(tmp_path):
    disk, said, now = Disk(), [], [0.0]
    log = ServiceLog(tmp_path / "executor.log", said.append, write=disk.write, clock=lambda: now[0])
    log.write(b"first line\n")
    log.write(b"second line\n")  # within the retry interval: dropped without a try
    now[0] += servicelog.LOG_RETRY_SECONDS + 1
    log.write(b"third line\n")  # tried again: the disk is still full
    assert disk.refused == 2
    assert len(said) == 1 and "no space left on its disk" in said[0] and "executor.log" in said[0]
    disk.full = False
    log.write(b"too soon\n")  # the retry interval after the last refusal has not passed: dropped too
    now[0] += servicelog.LOG_RETRY_SECONDS + 1
    log.write(b"fourth line\n")
    log.close()
    text = (tmp_path / "executor.log").read_text()
    assert text.splitlines() == [
        "[gpuyard up] 43 B of this process's output missing here: this file could not be written",
        "fourth line",
    ]
    assert len(said) == 2 and "again (43 B of output dropped)" in said[1]


def test_a_write_cut_short_by_the_disk_counts_what_it_did_not_write(tmp_path):
    calls = []

    def half_then_full(fd: int, data) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return os.write(fd, data[:4])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    log = ServiceLog(tmp_path / "submit.log", lambda _: None, write=half_then_full)
    log.write(b"0123456789")
    assert log.dropped == 6 and (tmp_path / "submit.log").read_bytes() == b"0123"
    log.close()


async def test_a_service_whose_log_cannot_be_written_is_never_held_up(tmp_path):
    """Far more output than a pipe holds, some of it lines no console takes as they are (longer than a pipe's
    buffer, rich's markup): the service writes it all and exits, and every line reaches the console."""
    disk, out = Disk(), io.StringIO()
    sup = Supervisor(Console(file=out, width=400), tmp_path, write=disk.write)
    code = (
        "import sys\n"
        "for i in range(4000): print(f'line {i} ' + 'x' * 500)\n"
        "print('y' * 200_000)\n"
        "print('a closing tag [/] and [bold]markup[/bold] as it is')\n"
        "print('the end')\n"
    )
    child = Child("monitor", [sys.executable, "-c", code], {})
    await sup.start(child)
    try:
        await until(lambda: child.proc.returncode is not None, "the service to write everything and exit")
        await asyncio.wait_for(child.pump, WITHIN)
    finally:
        await sup.stop(["monitor"])
    assert child.proc.returncode == 0
    console = out.getvalue()
    assert console.count("cannot write") == 1 and "no space left on its disk" in console
    assert "a closing tag [/] and [bold]markup[/bold] as it is" in console and "the end" in console
    assert disk.refused >= 1


async def test_its_log_is_written_again_once_the_disk_has_room(tmp_path, monkeypatch):
    monkeypatch.setattr(servicelog, "LOG_RETRY_SECONDS", 0.0)
    disk, out = Disk(), io.StringIO()
    sup = Supervisor(Console(file=out, width=400), tmp_path, write=disk.write)
    freed = tmp_path / "freed"
    code = (
        "import os, sys, time\n"
        "print('while full', flush=True)\n"
        f"while not os.path.exists({str(freed)!r}): time.sleep(0.05)\n"
        "print('after', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = Child("scheduler", [sys.executable, "-c", code], {})
    await sup.start(child)
    try:
        await until(lambda: "while full" in out.getvalue(), "the line written while the disk is full")
        disk.full = False
        freed.touch()
        await until(lambda: "after" in out.getvalue(), "the line written once there is room")
    finally:
        await sup.stop(["scheduler"])
    lines = (tmp_path / "scheduler.log").read_text().splitlines()
    assert lines[:2] == [
        "[gpuyard up] 11 B of this process's output missing here: this file could not be written",
        "after",
    ]
    assert "writing" in out.getvalue() and "again (11 B of output dropped)" in out.getvalue()


async def test_a_service_stops_even_when_a_process_it_left_holds_its_output_open(tmp_path):
    """Its exit is told by its status, not by the end of its output: a process it started keeps the pipe."""
    leftover = tmp_path / "leftover.pid"
    code = (
        "import signal, subprocess, sys, time\n"
        f"p = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(leftover)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(600)\n"
    )
    out = io.StringIO()
    sup = Supervisor(Console(file=out, width=400), tmp_path)
    child = Child("serving", [sys.executable, "-c", code], {})
    await sup.start(child)
    try:
        await until(lambda: "started" in out.getvalue(), "the service and what it started to run")
        await asyncio.wait_for(sup.stop(["serving"], grace=WITHIN), 3 * WITHIN)
        assert child.proc.returncode == 0 and "killing it" not in out.getvalue()
    finally:
        if leftover.exists():
            os.kill(int(leftover.read_text()), 9)
            await asyncio.wait_for(child.proc.stdout.read(), WITHIN)  # (its output's end: the pipe closed)


NATS_LINES = [
    "[1] 2026/11/29 04:03:39.538378 [ERR] Filestore [TEL] Critical write error: write /d/nats/jetstream/$G/"
    "streams/TEL/msgs/1.blk: no space left on device",
    "[1] 2026/11/29 04:03:39.538562 [ERR] JetStream stream '$G > TEL' critical write error: write /d/1.blk: no "
    "space left on device",
    "[1] 2026/11/29 04:03:39.538562 [ERR] JetStream out of File resources, will be DISABLED",
    "[1] 2026/11/29 04:03:39.538562 [WRN] Filesystem permission denied while writing msg, disabling JetStream: x",
]


def test_the_lines_of_nats_that_say_jetstream_cannot_write_are_told_apart():
    assert all(jetstream_broken(line) for line in NATS_LINES)
    assert not jetstream_broken("[1] 2026/11/29 04:03:38.533042 [INF]   Max Storage:     6.00 MB")
    assert not jetstream_broken("[1] 2026/11/29 04:03:38.533042 [INF] Server is ready")
    assert not jetstream_broken("critical write error, said by a service and not by NATS")


async def test_nats_that_failed_a_write_is_restarted_once_its_store_has_room(tmp_path):
    """A stand-in for nats-server that says, at its first start, what nats-server says when a stream's write
    fails: the supervisor restarts it once (its store, here, has room)."""
    starts = tmp_path / "starts"
    code = (
        "import sys, time\n"
        f"n = open({str(starts)!r}, 'a+').write('x')\n"
        f"first = len(open({str(starts)!r}).read()) == 1\n"
        "print('[1] 2026/11/29 [INF] Server is ready', flush=True)\n"
        f"if first: print({NATS_LINES[0]!r}, flush=True)\n"
        "time.sleep(600)\n"
    )
    out = io.StringIO()
    sup = Supervisor(Console(file=out, width=400), tmp_path, nats_store=tmp_path)
    nats = Child("nats", [sys.executable, "-c", code], {})
    await sup.start(nats)
    watcher = asyncio.create_task(sup.watch())
    first = nats.proc
    try:
        await until(
            lambda: nats.proc is not first and starts.exists() and len(starts.read_text()) == 2, "a restart"
        )
        await until(lambda: sup.healer.task.done(), "the restart to be over")
    finally:
        watcher.cancel()
        await sup.stop(["nats"])
    console = out.getvalue()
    assert "JetStream cannot write its streams" in console and "restarting NATS to heal JetStream" in console
    assert first.returncode is not None and nats.restarts == 0  # a restart it decided, not a crash
    assert Path(tmp_path / "nats.log").read_text().count("Server is ready") == 2
