"""A service learns that its supervisor died (`shared.service.until_gone`): the wait returns once the supervisor
is no longer its parent, whether it blocks on a pidfd or polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared import service

ROOT = Path(__file__).resolve().parents[2]
CHILD = "import os, sys; from shared.service import until_gone; until_gone(os.getppid()); open(sys.argv[1], 'w').write('gone')"
PARENT = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
    "print('up', flush=True); time.sleep(120)"
)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_the_wait_ends_when_the_supervisor_is_killed(tmp_path, pidfd):
    marker = tmp_path / "gone"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = CHILD if pidfd else "import os; del os.pidfd_open; " + CHILD
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, code, str(marker)], env=env, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout.readline() == b"up\n"
        time.sleep(0.5)
        assert not marker.exists()  # the supervisor lives: the child waits
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "gone"
    finally:
        parent.kill()
        parent.wait()


def test_a_process_that_is_not_the_parent_is_not_waited_for():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        service.until_gone(sleeper.pid)  # returns at once: it is not this process's supervisor
    finally:
        sleeper.kill()
        sleeper.wait()
