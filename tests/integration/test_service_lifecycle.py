"""A real service process (`run_service`): one whose main task crashes answers not ready from the crash on
and exits non-zero, even with a task that ignores cancellation, so its supervisor restarts it;
one whose supervisor dies ends too, even with its event loop stuck."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.integration.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CRASH_LINE = "background task main crashed; stopping the service"  # (`Service._guard`)


def readyz(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
    except httpx.HTTPError:
        return None


def service_argv(nats_url: str, tmp_path: Path, port: int) -> list[str]:
    argv = [sys.executable, "-m", "tests.integration.crashing_service", "--nats-url", nats_url]
    return [*argv, "--data-dir", str(tmp_path / "data"), "--health-port", str(port)]


def test_a_crashed_main_is_not_ready_from_the_crash_on_and_exits_nonzero(nats_url, tmp_path):
    port = free_port()
    trigger = tmp_path / "crash-now"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUYARD_TEST_CRASH": str(trigger)}
    output = tmp_path / "service.log"
    argv = service_argv(nats_url, tmp_path, port)
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=output.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: readyz(port) == 200, 30, what="the service ready")
        trigger.touch()
        answers: list[tuple[bool, int | None]] = []  # (the crash was in its log before the probe, the answer)

        def exited() -> bool:
            crash_said = CRASH_LINE in output.read_text()
            answers.append((crash_said, readyz(port)))
            return proc.poll() is not None

        # (a generous bound: it exits at most STOP_SECONDS + 3 after the crash, whatever ignores its cancel)
        wait_for(exited, 60, 0.05, "the service to exit after its main crashed")
        said = output.read_text()
        assert proc.returncode != 0, said
        after_crash = [answer for crash_said, answer in answers if crash_said]
        assert 503 in after_crash, answers  # not ready while it stops (its stubborn task holds it a while)
        assert 200 not in after_crash, answers  # and never ready again
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


SUPERVISOR = """
import os, subprocess, sys, time
from gpuyard.supervisor.child import die_with_parent as _die_with_parent
env = {**os.environ, "GPUYARD_SUPERVISOR_PID": str(os.getpid())}
child = subprocess.Popen(sys.argv[1:], env=env, preexec_fn=_die_with_parent, start_new_session=True)
print(child.pid, flush=True)
time.sleep(3600)
"""


def test_a_service_ends_with_its_supervisor_even_with_its_loop_stuck(nats_url, tmp_path):
    """As `gpuyard up` starts it (its pid in GPUYARD_SUPERVISOR_PID, SIGTERM when it dies); the service stuck
    in a call that never returns handles no signal: it must end all the same once its supervisor is gone."""
    port = free_port()
    trigger = tmp_path / "block-now"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GPUYARD_TEST_CRASH": str(trigger),
        "GPUYARD_TEST_BLOCK": "1",
    }
    argv = [sys.executable, "-c", SUPERVISOR, *service_argv(nats_url, tmp_path, port)]
    supervisor = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    pid = int(supervisor.stdout.readline())
    try:
        wait_for(lambda: readyz(port) == 200, 30, what="the service ready")
        trigger.touch()
        wait_for(lambda: readyz(port) is None, 10, what="the service's loop stuck")
        supervisor.kill()
        supervisor.wait(10)
        wait_for(lambda: not running(pid), 25, 0.2, "the service to end with its supervisor")
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        if supervisor.poll() is None:
            supervisor.kill()


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie is dead, waiting for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
