"""posix_spawn starts a replica's process as Popen would: same session, descriptors, signals, directory and
environment, the command found on the environment's PATH, and the same errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.executor import spawn

pytestmark = pytest.mark.skipif(not spawn.AVAILABLE, reason="posix_spawn with chdir needs glibc 2.34+")

REPORT = """
import json, os, sys
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print(json.dumps({
    "cwd": os.getcwd(),
    "new_session": os.getsid(0) == os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"),
    "stdout_is_stderr": os.path.samestat(os.fstat(1), os.fstat(2)),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "ignored_signals": status["SigIgn"].strip(),
    "blocked_signals": status["SigBlk"].strip(),
    "env": {k: v for k, v in os.environ.items() if k.startswith("GPUYARD_")},
    "argv": sys.argv[1:],
}))
"""


def run(start, tmp_path: Path) -> dict:
    read_fd, write_fd = os.pipe()
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)  # an inheritable descriptor of the executor's must not reach the job
    try:
        pid = start(write_fd)
    finally:
        os.close(write_fd)
        os.close(leaked)
    with os.fdopen(read_fd, "rb") as out:
        output = out.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, output
    return json.loads(output)


def test_the_child_gets_what_popen_gives_it(tmp_path):
    argv = [sys.executable, "-c", REPORT, "a b", "ü"]
    env = {"PATH": os.environ["PATH"], "GPUYARD_JOB": "j1", "GPUYARD_ODD": "x=y ü"}

    def popen(fd):
        options = dict(cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
        proc = subprocess.Popen(argv, start_new_session=True, **options)
        proc.returncode = 0  # waited for below, not by Popen
        return proc.pid

    by_popen = run(popen, tmp_path)
    by_spawn = run(lambda fd: spawn.spawn(argv, cwd=tmp_path, env=env, output_fd=fd), tmp_path)
    # glibc's two internal signals (32, 33: below SIGRTMIN) may start out ignored in a child of either, as
    # the C library's version and its spawn path decide; the program's own C library installs its handlers
    internal = (1 << 31) | (1 << 32)
    for child in (by_popen, by_spawn):
        child["ignored_signals"] = f"{int(child['ignored_signals'], 16) & ~internal:016x}"
    assert by_spawn == by_popen
    assert by_spawn["cwd"] == str(tmp_path) and by_spawn["new_session"] and by_spawn["stdin"] == "/dev/null"
    assert by_spawn["fds"] == [0, 1, 2, 3]  # (3: the listing's own descriptor)
    assert by_spawn["env"] == {"GPUYARD_JOB": "j1", "GPUYARD_ODD": "x=y ü"}


def test_the_command_is_found_on_the_environments_path_even_when_it_moves(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    script = "#!/bin/sh\necho from-$0\n"
    (first / "tool").write_text(script)
    (first / "tool").chmod(0o755)
    env = {"PATH": f"{first}:{second}"}

    def output() -> str:
        read_fd, write_fd = os.pipe()
        pid = spawn.spawn(["tool"], cwd=tmp_path, env=env, output_fd=write_fd)
        os.close(write_fd)
        with os.fdopen(read_fd) as out:
            text = out.read().strip()
        os.waitpid(pid, 0)
        return text

    assert output() == f"from-{first}/tool"
    (first / "tool").unlink()
    (second / "tool").write_text(script)
    (second / "tool").chmod(0o755)
    assert output() == f"from-{second}/tool"  # where it was found last is tried, then the PATH again


def test_errors_are_those_popen_raises(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    with pytest.raises(FileNotFoundError) as missing:
        spawn.spawn(["no-such-command-here"], cwd=tmp_path, env=env, output_fd=1)
    assert missing.value.filename == "no-such-command-here"
    with pytest.raises(FileNotFoundError):
        spawn.spawn(["./missing.sh"], cwd=tmp_path, env=env, output_fd=1)
    (tmp_path / "data.txt").write_text("not a program")
    with pytest.raises(PermissionError):
        spawn.spawn(["./data.txt"], cwd=tmp_path, env=env, output_fd=1)
    with pytest.raises(FileNotFoundError) as no_dir:
        spawn.spawn(["true"], cwd=tmp_path / "gone", env=env, output_fd=1)
    assert no_dir.value.filename == str(tmp_path / "gone")
    with pytest.raises(ValueError):
        spawn.spawn(["true"], cwd=tmp_path, env={**env, "A=B": "c"}, output_fd=1)


@pytest.mark.parametrize(
    "where",
    [
        {"argv": ["tr\0ue"]},
        {"argv": ["true", "a\0b"]},
        {"env": {"A": "b\0c"}},
        {"env": {"A\0B": "c"}},
        {"cwd": "/tmp\0/x"},
    ],
)
def test_a_nul_byte_anywhere_is_refused_as_popen_refuses_it(tmp_path, where):
    """A C string ends at its NUL: what follows it would silently be dropped (a cwd of '/tmp\0/x' is /tmp)."""
    start = {"argv": ["true"], "cwd": tmp_path, "env": {"PATH": "/usr/bin:/bin"}, **where}
    with pytest.raises(ValueError, match="null byte"):
        spawn.spawn(start.pop("argv"), **start, output_fd=1)


def test_a_relative_path_entry_is_left_to_popen(tmp_path):
    assert spawn.spawn(["true"], cwd=tmp_path, env={"PATH": "bin:/usr/bin"}, output_fd=1) is None
