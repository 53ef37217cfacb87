"""The README's quick start, as a new user types it: `make demo` in the checkout, then, in another terminal,
each command of the README's next block, unchanged (only JOB_ID is a job's id), from a shell whose PATH does
not have the venv. Each must succeed and say what the README promises."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import free_ports, wait_for

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", README, re.S)

pytestmark = pytest.mark.integration


def lines(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_starts_with_exactly_two_commands():
    assert [shlex.split(line)[:2] for line in lines(BLOCKS[0])] == [["make", "demo"], ["make", "test"]]


@pytest.fixture
def demo(tmp_path):
    """`make demo` on free ports, with a home of its own (data dir and saved token) and the venv off the PATH;
    and a shell folder where `.venv` and `examples` are the checkout's, so that commands run as typed."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUYARD_", "XDG_"))}
    env.update(HOME=str(home), PATH=":".join(p for p in env["PATH"].split(":") if p != bin_dir))
    port, nats_port, monitor_port = free_ports(3)  # (serving keeps 8000: the README's infer.py asks it there)
    log = (tmp_path / "demo.log").open("w+")
    make = subprocess.Popen(
        ["make", "demo", f"PORT={port}", f"NATS_PORT={nats_port}", f"MONITOR_PORT={monitor_port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    shell = tmp_path / "shell"
    shell.mkdir()
    for name in (".venv", "examples", "train-and-serve-out"):  # (the last: what the example job writes)
        (shell / name).symlink_to(ROOT / name)
    try:
        wait_for(lambda: "demo job succeeded" in (tmp_path / "demo.log").read_text(), 120, 0.5, "make demo")
        yield env, shell, (tmp_path / "demo.log")
    finally:
        os.killpg(make.pid, signal.SIGINT)
        make.wait(60)
    assert "Stopped; no process left behind." in (tmp_path / "demo.log").read_text()


def run(line: str, env: dict, cwd: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    """A README line in a shell; the deadline only catches a hang (the simulator's three policies took over
    300 s on two busy cores)."""
    return subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_every_quick_start_command_works_as_typed(demo, request):
    env, shell, demo_log = demo
    text = demo_log.read_text()
    assert "GPUYARD is up." in text and "hello from replica 0 of 2" in text
    assert "as context 'default', now the current one" in text  # (its home's default data dir)
    assert "run it as root" not in text or os.geteuid() != 0  # the banner speaks to whoever runs it
    commands = lines(BLOCKS[1])
    assert commands[0] == ".venv/bin/gpuyard submit examples/hello.yaml --follow"
    # the simulator needs no platform: it runs as typed in a terminal of its own, beside the other commands
    (sim_line,) = [line for line in commands if " sim " in line]
    sim_log = shell.parent / "sim.log"
    with sim_log.open("w") as out:
        sim = subprocess.Popen(
            sim_line,
            shell=True,
            cwd=shell,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    request.addfinalizer(lambda: sim.poll() is None and os.killpg(sim.pid, signal.SIGKILL))
    job_id = None
    for line in commands:
        if (
            "cancel JOB_ID" in line
        ):  # a job that runs until it is cancelled (hello.yaml's 2 s could end first)
            (shell / "waits.yaml").write_text("name: waits\ncommand: sleep 600\nresources: {gpus: 1}\n")
            submitted = run(".venv/bin/gpuyard submit waits.yaml", env, shell)
            line = line.replace("JOB_ID", submitted.stdout.split("submitted job ")[1].split()[0])
        if line == sim_line:
            continue
        result = run(line.replace("JOB_ID", job_id or "JOB_ID"), env, shell)
        said = result.stdout + result.stderr
        assert result.returncode == 0, f"{line}\n{said}"
        if "submit examples/hello.yaml" in line:
            job_id = result.stdout.split("submitted job ")[1].split()[0]
            assert (
                f"hello from {job_id} on GPU 0" in said
                and "bye" in said
                and f"job {job_id} succeeded" in said
            )
        elif "ddp-cpu.yaml" in line:
            finals = re.findall(r"^r([01]) \| (final: .*)$", result.stdout, re.M)
            assert sorted(r for r, _ in finals) == ["0", "1"] and finals[0][1] == finals[1][1], said
        elif " ps " in line or " describe " in line:
            assert job_id in said and "succeeded" in said
        elif " why " in line:
            assert job_id in said
        elif " logs " in line:
            assert f"hello from {job_id}" in said
        elif " cancel " in line:
            assert "cancel" in said
        elif " context " in line:
            assert "default" in said and f"127.0.0.1:{port_of(text)}" in said
        else:
            pytest.fail(f"the test does not know what to expect of {line!r}")
    server = re.search(r"API (http://\S+)", text).group(1)
    assert httpx.get(f"{server}/healthz").status_code == 200
    train_and_serve(env, shell)
    data_in_results_out(env, shell)
    # (the deadline only catches a hang: the simulator's three policies took over 300 s on two busy cores)
    sim.wait(timeout=1200)
    said = sim_log.read_text()
    assert sim.returncode == 0, f"{sim_line}\n{said}"
    plot = re.search(r"--plot (\S+)", sim_line).group(1)
    assert (shell / plot).stat().st_size > 10_000 and "gpuyard" in said


def port_of(demo_text: str) -> str:
    """The API's port, as `make demo` said it."""
    return re.search(r"API http://\S+:(\d+)", demo_text).group(1)


def data_in_results_out(env: dict, shell: Path) -> None:
    """The README's volume → job → kept outputs block, as typed (JOB_ID: the job it submits)."""
    commands = lines(BLOCKS[3])
    assert commands[0].startswith(".venv/bin/gpuyard volumes create points")
    job_id = None
    for line in commands:
        result = run(line.replace("JOB_ID", job_id or "JOB_ID"), env, shell)
        said = result.stdout + result.stderr
        assert result.returncode == 0, f"{line}\n{said}"
        if " create " in line:
            assert "volume points made" in said, said
        elif " upload " in line:
            assert "in points:storage" in said, said
        elif " submit " in line:
            job_id = result.stdout.split("submitted job ")[1].split()[0]
            assert "600 points; starting at step 0" in said and "succeeded" in said, said
        elif "--download" in line:
            kept = json.loads((shell / "fitted" / "model.json").read_text())
            assert abs(kept["a"] - 3.0) < 0.1 and kept["points"] == 600, kept
        elif " artifacts " in line:
            assert "model.json" in said, said
        else:
            pytest.fail(f"the test does not know what to expect of {line!r}")


def train_and_serve(env: dict, shell: Path) -> None:
    """The README's train → publish → serve block, as typed, against the same `make demo`."""
    commands = lines(BLOCKS[2])
    assert "examples/train-and-serve/job.yaml" in commands[0]
    for line in commands:
        result = run(line, env, shell)
        said = result.stdout + result.stderr
        assert result.returncode == 0, f"{line}\n{said}"
        if "job.yaml" in line:
            assert "published blobs version 1" in said and "succeeded" in said, said
        elif line.endswith(" ps"):
            assert "blobs:1" in said and "0.25" in said, said
        elif " describe " in line:
            assert "blobs" in said and "1" in said, said
        elif "infer.py" in line:
            assert "the served answers match PyTorch's" in said, said
        elif " undeploy " in line:
            assert "blobs" in said, said
        else:
            pytest.fail(f"the test does not know what to expect of {line!r}")
