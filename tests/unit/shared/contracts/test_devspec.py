"""A dev environment in the job spec (shared/contracts/devspec.py, jobspec.py): a `dev` block instead of a
command, one replica; its command is the platform's script, which starts JupyterLab on loopback with the port
and token the executor gives it, and says in one line how to install JupyterLab where it is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from gpuyard.shared.contracts.devspec import (
    LAB_FOLDER,
    LAB_LAUNCHER,
    LSP_SETTINGS,
    NEWS_SETTINGS,
    NOT_INSTALLED_EXIT,
    DevSpec,
    dev_url,
)
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


def fake_jupyterlab(tmp_path) -> dict[str, str]:
    """A `python` that has JupyterLab, whose launcher writes down the environment and arguments it got."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    fake = tmp_path / "bin" / "python"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in *labapp*) env > started-with.env; echo "$@" > started-with.args;; esac\n'
    )
    fake.chmod(0o755)
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUYARD_DEV_PORT": "20001", "JUPYTER_TOKEN": "t"}


def test_jupyterlab_keeps_its_settings_with_the_notebooks_asks_nothing_about_news_and_runs_lsp_when_on(
    tmp_path,
):
    done = script(tmp_path, fake_jupyterlab(tmp_path))
    assert done.returncode == 0, done.stderr
    lab = tmp_path / "notebooks" / LAB_FOLDER
    started = dict(
        line.split("=", 1) for line in (tmp_path / "started-with.env").read_text().splitlines() if "=" in line
    )
    assert started["JUPYTERLAB_SETTINGS_DIR"] == f"{tmp_path}/notebooks/{LAB_FOLDER}/user-settings"
    assert started["JUPYTERLAB_WORKSPACES_DIR"] == f"{tmp_path}/notebooks/{LAB_FOLDER}/workspaces"
    news = lab / "user-settings" / NEWS_SETTINGS
    assert json.loads(news.read_text()) == {"fetchNews": "false", "checkForUpdates": False}

    assert "{'jupyter_lsp': False}" in (tmp_path / "started-with.args").read_text()

    news.write_text('{"fetchNews": "true"}')  # (the user turned news on: a later start keeps their choice)
    lsp = lab / "user-settings" / LSP_SETTINGS
    lsp.parent.mkdir(parents=True)
    lsp.write_text(
        '{\n  // on, in the settings editor\n  "activate": "on"\n}'
    )  # (JSON5, as JupyterLab writes)
    assert script(tmp_path, fake_jupyterlab(tmp_path)).returncode == 0
    assert news.read_text() == '{"fetchNews": "true"}'
    assert "{'jupyter_lsp': True}" in (tmp_path / "started-with.args").read_text()


def test_the_launcher_imports_rfc3987_syntax_at_its_first_use_and_checks_the_same(tmp_path):
    """JupyterLab's server, less the second that `rfc3987_syntax` takes to import: here a stand-in
    `jupyterlab.labapp` checks IRIs as the server's event schemas do (jsonschema's format checker)."""
    pytest.importorskip("rfc3987_syntax")
    (tmp_path / "jupyterlab").mkdir()
    (tmp_path / "jupyterlab" / "__init__.py").write_text("")
    (tmp_path / "jupyterlab" / "labapp.py").write_text(
        "import sys\n"
        "from jsonschema import FormatChecker\n"
        "def main():\n"
        "    assert 'rfc3987_syntax.syntax_helpers' not in sys.modules, 'imported at start'\n"
        "    checker = FormatChecker()\n"
        "    said = [checker.conforms(iri, 'iri') for iri in ('http://a/é', 'http://a/b', 'no iri', 'http://a/b')]\n"
        "    print(said, sys.argv[1:], 'rfc3987_syntax.syntax_helpers' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", LAB_LAUNCHER, "--port=1"], env={"PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[True,", "True,", "False,", "True]", "['--port=1']", "True"]
    assert "'" not in LAB_LAUNCHER  # (DEV_SCRIPT quotes it so)
