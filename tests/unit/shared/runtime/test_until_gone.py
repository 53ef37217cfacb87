"""A service learns that its supervisor died (`gpuyard.shared.runtime.service.until_gone`): the wait returns once the supervisor
is no longer its parent, whether it blocks on a pidfd or polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard.shared.runtime import service

ROOT = Path(__file__).resolve().parents[4]
# The supervisor's pid comes in argv, as `gpuyard up` passes it in the settings: a child that asked for its parent
# after a slow start (a loaded machine) would wait for whoever adopted it.
CHILD = (
    "import os, sys; from pathlib import Path; from gpuyard.shared.runtime.service import until_gone; "
    "marker = Path(sys.argv[1]); marker.write_text('waiting'); until_gone(int(sys.argv[2])); marker.write_text('gone')"
)
PARENT = (
    "import os, subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], str(os.getpid())]); time.sleep(120)"
)


def wait_for(marker: Path, text: str, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text() == text:
            break
        time.sleep(0.05)
    return marker.read_text() if marker.exists() else "(no file)"


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_the_wait_ends_when_the_supervisor_is_killed(tmp_path, pidfd):
    marker = tmp_path / "gone"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = CHILD if pidfd else "import os; del os.pidfd_open; " + CHILD
    parent = subprocess.Popen([sys.executable, "-c", PARENT, code, str(marker)], env=env)
    try:
        assert wait_for(marker, "waiting") == "waiting"
        time.sleep(0.5)
        assert marker.read_text() == "waiting"  # the supervisor lives: the child waits
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_for(marker, "gone") == "gone"
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
