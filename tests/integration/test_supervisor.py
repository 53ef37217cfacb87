"""However `gpuyard up` ends, no process of its platform outlives it: killed (SIGKILL) while its services are
still stopping, its NATS server and every service end too. Its files are its own (0600, 0700). A
service that keeps crashing is said to crash-loop, with its last words, on the console, on the bus and in
`GET /v1/services`."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from gpuyard.shared.bus.credentials import BusCredentials, write_credentials
from gpuyard.shared.contracts.api.platform import ServiceOut
from gpuyard.shared.contracts.events.services import ProcessState, ServiceStatus
from gpuyard.supervisor import supervision
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.statusreport import PENDING_CHANGES, StatusReporter
from gpuyard.supervisor.supervision import CRASH_LOOP, STARTED_LINE, Supervisor
from tests.integration.conftest import BIN, Platform, free_ports, wait_for
from tests.integration.processes import children, descendants


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


EXECUTOR_STOPPING = "gpuyard.service: executor stopping"  # what an executor logs once it is told to stop


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
        wait_for(  # its services are stopping: the executors stop the job, which makes them wait out its grace
            lambda: any(
                EXECUTOR_STOPPING in log.read_text()
                for log in (platform.data_dir / "logs").glob("executor*.log")
            ),
            30,
            0.05,
            "an executor to say it is stopping",
        )
        up.kill()
        up.wait(10)
        try:
            # (a generous bound: a service ends at most STOP_SECONDS + 3 after it sees its supervisor gone)
            wait_for(lambda: not any(alive(p) for p in pids), 60, 0.2, "the platform's processes to end")
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
    # every port its own, none of the defaults (another platform on the machine may hold them)
    port, nats_port, serving_port, monitor_port = free_ports(4)
    env = {
        **os.environ,
        "GPUYARD_CONFIG_DIR": str(tmp_path / "config"),
        "GPUYARD_JOB_USERS": "x=no-such-user",
    }
    argv = [str(BIN / "gpuyard"), "up", "--data-dir", str(tmp_path / "data"), "--simulate-gpus", "1"]
    run = subprocess.run(
        [*argv, "--port", str(port), "--nats-port", str(nats_port), "--serving-port", str(serving_port)]
        + ["--monitor-port", str(monitor_port)],
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


async def supervise(child: Child, tmp_path: Path, until, what: str, within: float = 30):
    """Run `child` under a Supervisor until `until(statuses)`: (the statuses it reported, its console)."""
    out = io.StringIO()
    reported: list[ServiceStatus] = []
    sup = Supervisor(Console(file=out, width=300), tmp_path, report=reported.append)
    await sup.start(child)
    watcher = asyncio.create_task(sup.watch())
    try:
        await asyncio.to_thread(wait_for, lambda: until(reported), within, 0.1, what)
    finally:
        watcher.cancel()
        await sup.stop([child.name])
    return reported, out.getvalue()


async def test_a_child_that_keeps_crashing_is_reported_restarting_then_crash_looping_with_its_last_words(
    tmp_path,
):
    crash = Child("serving", [sys.executable, "-c", "print('cannot open /nowhere'); raise SystemExit(1)"], {})
    looping = ProcessState.CRASH_LOOPING
    reported, _ = await supervise(
        crash, tmp_path, lambda got: any(s.state is looping for s in got), "a crash loop reported"
    )
    first, *exits_and_starts = reported
    assert (first.state, first.restarts, first.exit_code, first.last_error) == (
        ProcessState.RUNNING,
        0,
        None,
        None,
    )
    assert first.service == first.process == "serving" and first.host == socket.gethostname()
    exited = exits_and_starts[0::2]  # each exit, of the process that exited; then its successor's start
    started = exits_and_starts[1::2]
    assert [(s.state, s.restarts) for s in exited] == [
        (ProcessState.RESTARTING, 1),
        (ProcessState.RESTARTING, 2),
        (ProcessState.CRASH_LOOPING, 3),
    ]
    assert all(s.exit_code == 1 and s.last_error == "cannot open /nowhere" for s in exited)
    assert [s.pid for s in exited] == [first.pid] + [s.pid for s in started[:2]]
    assert len({s.pid for s in reported}) == len(started) + 1  # a new process at each start
    assert [(s.state, s.restarts) for s in started] == [(s.state, s.restarts) for s in exited[: len(started)]]


async def test_a_child_that_runs_a_while_after_its_crash_is_reported_running_again(tmp_path, monkeypatch):
    monkeypatch.setattr(supervision, "STABLE_SECONDS", 1.5)
    fixed = tmp_path / "fixed"
    code = (
        f"import os, sys, time\nif not os.path.exists({str(fixed)!r}):\n"
        "    print('no model store'); sys.exit(3)\nprint('serving'); time.sleep(600)"
    )

    def fixed_after_first_exit(got: list[ServiceStatus]) -> bool:
        if any(s.state is ProcessState.RESTARTING for s in got):
            fixed.touch()
        return got[-1].state is ProcessState.RUNNING and got[-1].restarts == 1

    reported, console = await supervise(
        Child("serving", [sys.executable, "-c", code], {}), tmp_path, fixed_after_first_exit, "running again"
    )
    exit_ = next(s for s in reported if s.state is ProcessState.RESTARTING)
    assert (exit_.exit_code, exit_.last_error) == (3, "no model store")
    again = reported[-1]
    assert again.pid != exit_.pid and (again.exit_code, again.last_error) == (None, None)
    assert "running again" in console


async def test_a_child_that_refuses_its_configuration_is_reported_refused_with_its_reason(tmp_path):
    refusal = "print('serving refuses to start: serving_port: not a port'); raise SystemExit(2)"
    reported, _ = await supervise(
        Child("serving", [sys.executable, "-c", refusal], {}),
        tmp_path,
        lambda got: got[-1].state is ProcessState.REFUSED,
        "the refusal reported",
    )
    last = reported[-1]
    assert (last.restarts, last.exit_code) == (0, 2)
    assert last.last_error == "serving refuses to start: serving_port: not a port"


async def test_reporting_never_holds_the_supervisor_up_with_nats_away(tmp_path, caplog):
    """No NATS at all: an update only records (the changes kept are bounded), the reporter keeps trying to
    connect, and closing it ends its task."""
    write_credentials(tmp_path / "supervisor.json", BusCredentials("supervisor", "pw"))
    nowhere = f"nats://127.0.0.1:{free_ports(1)[0]}"
    reporter = StatusReporter([nowhere], tmp_path / "supervisor.json", interval=0.1)
    reporting = asyncio.create_task(reporter.run())
    status = ServiceStatus(
        service="serving", process="serving", host="h", pid=1, state=ProcessState.RESTARTING, version="1"
    )
    for _ in range(1000):
        assert reporter.update(status) is None  # a plain call: nothing to wait for
    assert reporter.latest == {"serving": status} and len(reporter.changes) == PENDING_CHANGES

    def failed_tries() -> int:  # (each try the NATS client makes and fails, `Bus.connect` logs)
        return sum(
            r.name == "gpuyard.shared.bus.jetstream" and r.getMessage().startswith("nats: ")
            for r in caplog.records
        )

    await asyncio.to_thread(wait_for, lambda: failed_tries() >= 3, 60, 0.1, "the reporter to try again")
    assert not reporting.done()  # still trying to connect
    await asyncio.wait_for(reporter.close(reporting), 60)  # (a generous bound: its own are PUBLISH_SECONDS)
    assert reporting.done()


def serving_process(up_pid: int) -> int | None:
    """The serving process `gpuyard up` runs now."""
    for pid in children(up_pid):
        with contextlib.suppress(OSError):
            if b"gpuyard.services.serving" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


def said_last(log: Path, pid: int) -> str:
    """The last line process `pid` wrote to its service's log: its lines end where the next process's start."""
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if f"started (pid {pid}," in line)
    after = next((i for i in range(first + 1, len(lines)) if STARTED_LINE in lines[i]), len(lines))
    return lines[after - 1]


def test_a_service_that_keeps_crashing_is_listed_crash_looping_with_its_last_error(tmp_path):
    """The serving service killed (SIGKILL, as the OOM killer would) once it has started, three times in a
    row within a minute: `GET /v1/services` says it is restarting, then crash-looping, with its restarts, its
    exit code and the last line it wrote, on each process it was (their heartbeats say nothing of it) and on
    the one started since."""
    platform = Platform(tmp_path / "data", tmp_path / "config", simulate_gpus=1, executors=1).start()
    client = platform.client()
    log = tmp_path / "data" / "logs" / "serving.log"
    killed: list[int] = []

    def serving(state: str) -> dict[int, ServiceOut]:
        return {s.pid: s for s in client.services() if s.service == "serving" and s.state == state}

    try:
        for n in range(1, CRASH_LOOP + 1):
            pid = wait_for(
                lambda: (p := serving_process(platform.proc.pid)) not in killed and p,
                30,
                0.1,
                "a new serving",
            )
            wait_for(  # it said it started, and is listed (the first by its heartbeat: nothing else lists it)
                lambda pid=pid: (
                    log.exists()  # (a process of it is there before its log: on a busy machine, seconds before)
                    and f"started (pid {pid}," in log.read_text()
                    and any(s.pid == pid for s in client.services())
                ),
                30,
                0.2,
                f"serving {pid} started",
            )
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            if n == 1:
                first = wait_for(
                    lambda pid=pid: serving("restarting").get(pid), 15, 0.2, "serving restarting"
                )
                assert (first.restarts, first.exit_code) == (1, -signal.SIGKILL)
                assert first.last_error == said_last(log, pid).split(" ", 3)[3]  # without time and name
        looping = wait_for(lambda: serving("crash_looping").get(killed[-1]), 15, 0.2, "serving crash-looping")
        assert (looping.restarts, looping.exit_code) == (CRASH_LOOP, -signal.SIGKILL)
        assert looping.last_error and looping.last_error == said_last(log, killed[-1]).split(" ", 3)[3]
        assert killed[0] in serving("crash_looping"), client.services()  # though its heartbeats said it ran
        successor = wait_for(
            lambda: next((r for p, r in serving("crash_looping").items() if p not in killed), None),
            20,
            0.2,
            "the serving started since",
        )
        assert successor.pid == serving_process(platform.proc.pid) and successor.restarts == CRASH_LOOP
        assert not serving("running")
        assert "crash-looping" in platform.log.read_text()  # the console says it too
    finally:
        platform.stop()
