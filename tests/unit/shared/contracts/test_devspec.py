"""A dev environment in the job spec (shared/contracts/devspec.py, jobspec.py): a `dev` block instead of a
command, one replica; its command is the platform's script, which starts JupyterLab on loopback with the port
and token the executor gives it, and says in one line how to install JupyterLab where it is missing."""

from __future__ import annotations

import os
import subprocess

import pytest
from pydantic import ValidationError

from gpuyard.shared.contracts.devspec import NOT_INSTALLED_EXIT, DevSpec, dev_url
from gpuyard.shared.contracts.jobspec import JobSpec, start_bytes, start_error
from gpuyard.shared.runtime.installhint import install_command


def test_a_dev_job_runs_the_platforms_script_and_fits_a_start():
    spec = JobSpec.model_validate({"dev": {}, "resources": {"gpus": 0.5}, "idle_timeout": "2h"})
    assert spec.command is None and spec.dev == DevSpec(root="notebooks")
    assert spec.argv[:2] == ["/bin/sh", "-c"] and 'GPUYARD_DEV_ROOT="notebooks"' in spec.argv[2]
    assert "--ip=127.0.0.1" in spec.argv[2] and "JUPYTER_TOKEN" in spec.argv[2]
    assert start_bytes(spec) > 0 and start_error(spec) is None
    assert dev_url("abc") == "/dev/abc/lab"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"dev": {}, "command": "x"}, "has no command"),
        ({"dev": {}, "serve": {"model": "m", "version": 1}}, "has no command"),
        ({"dev": {}, "replicas": 2}, "replicas must be 1"),
        ({"dev": {"root": ".."}}, "should match pattern"),
        ({"dev": {"root": "a/b"}}, "should match pattern"),
        ({"dev": {"shell": "bash"}}, "the fields here are root"),
        ({}, "`dev`: a dev environment"),
    ],
)
def test_what_a_dev_job_may_not_be(spec, words):
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate(spec)
    assert words in str(refused.value)


def script(tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        DevSpec().argv(), cwd=tmp_path, env={"PATH": os.environ["PATH"], "GPUYARD_NODE": "node-a", **env},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_without_jupyterlab_it_says_in_one_line_how_to_install_it(tmp_path):
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")  # a Python without jupyterlab
    fake.chmod(0o755)
    hint = install_command("dev")  # (what the node's executor gives the replica: `jobenv.notebook_env`)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUYARD_DEV_PORT": "20001", "JUPYTER_TOKEN": "t"}
    done = script(tmp_path, {**env, "GPUYARD_DEV_INSTALL": hint})
    assert done.returncode == NOT_INSTALLED_EXIT
    [line] = done.stderr.splitlines()
    assert "JupyterLab is not installed" in line and hint in line and "node-a" in line


def test_without_a_port_or_token_from_the_executor_it_says_so(tmp_path):
    done = script(tmp_path, {})
    assert done.returncode == NOT_INSTALLED_EXIT and "gives dev environments no port or token" in done.stderr
