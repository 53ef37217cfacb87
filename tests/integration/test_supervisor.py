"""However `gpuyard up` ends, no process of its platform outlives it: killed (SIGKILL) while its services are
still stopping, its NATS server and every service end within seconds. Its files are its own (0600, 0700)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from gpuyard.up import Child, Supervisor
from tests.integration.conftest import BIN, Platform, free_ports, wait_for


def children(pid: int) -> set[int]:
    """`pid`'s child processes, from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found |= {int(p) for p in text.split()}
    return found


def descendants(pid: int) -> set[int]:
    found = children(pid)
    for child in list(found):
        found |= descendants(child)
    return found


def started(pid: int) -> str | None:
    """When `pid` started (against pid reuse), None if it is gone or a zombie (dead, waiting to be reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else fields[19]


def describe(pids: set[int]) -> str:
    lines = []
    for pid in sorted(pids):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            lines.append(f"{pid}: {b' '.join(argv).decode()}")
        except OSError:
            pass
    return "\n".join(lines)


def test_no_process_outlives_up_killed_during_its_shutdown(tmp_path):
    platform = Platform(tmp_path / "data", tmp_path / "config").start()
    up = platform.proc
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    job = platform.client().submit({"command": [sys.executable, "-c", stubborn], "resources": {"gpus": 1}})
    platform.wait_state(job.job_id, {"running"})
    pids = {pid: started(pid) for pid in descendants(up.pid)}
    named = describe(set(pids))

    def alive(pid: int) -> bool:
        return started(pid) == pids[pid] is not None

    try:
        assert len(pids) >= 7, describe(pids)  # nats, the services (two executors) and the job
        up.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # its services are stopping, one after the other
        up.kill()
        up.wait(10)
        try:
            wait_for(lambda: not any(alive(p) for p in pids), 15, 0.2, "the platform's processes to end")
        except AssertionError:
            raise AssertionError(f"left: {describe({p for p in pids if alive(p)})}\nof:\n{named}") from None
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_platforms_files_are_readable_by_its_user_alone(tmp_path):
    platform = Platform(tmp_path / "data", tmp_path / "config").start()
    client = platform.client()
    job = client.submit(
        {"name": "secret", "command": "umask; touch made-by-the-job", "resources": {"gpus": 1}}
    )
    platform.wait_state(job.job_id, {"succeeded"})
    assert client.logs(job.job_id).strip() == "0022"  # jobs keep the usual umask, not the platform's
    assert platform.stop() == 0
    data = tmp_path / "data"
    jobs = data / "jobs"
    exposed = []
    for path in [data, *data.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink() or (path.parent.name.startswith("work-") and path.parent.is_relative_to(jobs)):
            continue  # what a job itself writes in its working directory is the job's business
        if mode & 0o077:
            exposed.append(f"{oct(mode)} {path.relative_to(data)}")
    names = {p.name for p in data.rglob("*")}
    assert {"events.db", "logs.db", "tokens.json", "logs", "jobs", "nats"} <= names, sorted(names)
    assert not exposed, "\n".join(exposed)
    made = jobs / job.job_id / "attempt-1" / "work-0" / "made-by-the-job"
    assert stat.S_IMODE(made.stat().st_mode) == 0o644


def test_a_service_that_refuses_its_configuration_stops_up_with_its_reason(tmp_path):
    port, nats_port = free_ports(2)
    env = {
        **os.environ,
        "GPUYARD_CONFIG_DIR": str(tmp_path / "config"),
        "GPUYARD_JOB_USERS": "x=no-such-user",
    }
    argv = [str(BIN / "gpuyard"), "up", "--data-dir", str(tmp_path / "data"), "--simulate-gpus", "1"]
    run = subprocess.run(
        [*argv, "--port", str(port), "--nats-port", str(nats_port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout[-3000:]
    assert "GPUYARD is up" not in run.stdout and "restarting" not in run.stdout
    last = run.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"gpuyard up: executor(-1)? refused its configuration: job_users: no user 'no-such-user' on this "
        r"machine; stopped\.",
        last,
    ), last


async def test_a_child_that_keeps_crashing_is_said_to_crash_loop_with_its_last_words(tmp_path):
    out = io.StringIO()
    sup = Supervisor(Console(file=out, width=300), tmp_path)
    crash = Child("crashy", [sys.executable, "-c", "print('cannot open /nowhere'); raise SystemExit(1)"], {})
    await sup.start(crash)
    watcher = asyncio.create_task(sup.watch())
    try:
        await asyncio.to_thread(wait_for, lambda: "crash-looping" in out.getvalue(), 30, 0.1, "a crash loop")
    finally:
        watcher.cancel()
        await sup.stop(["crashy"])
    line = next(line for line in out.getvalue().splitlines() if "crash-looping" in line)
    assert "restart #3" in line and "last said: cannot open /nowhere" in line
