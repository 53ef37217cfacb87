"""`gpuyard dev` (gpuyard/cli/dev.py): what `dev start` sends (its GPUs, name, idle timeout, environment from a
requirements file or a list), and `dev open` printing the URL, opening a browser only where there is a display."""

from __future__ import annotations

import pytest

from gpuyard.cli import build_parser
from gpuyard.cli import dev as dev_cli
from gpuyard.cli.common import CliError


def parsed(*argv: str):
    return build_parser().parse_args(["dev", *argv])


def test_start_sends_what_was_asked():
    args = parsed(
        "start", "--gpus", "0.5", "--name", "explore", "--idle-timeout", "30m", "--priority", "high"
    )
    assert dev_cli.body_of(args) == {
        "gpus": 0.5,
        "name": "explore",
        "idle_timeout": "30m",
        "priority": "high",
    }
    assert dev_cli.body_of(parsed("start")) == {"gpus": 0}
    listed = parsed("start", "--env", "jupyterlab, torch==2.13.0", "--python", "3.11")
    assert dev_cli.body_of(listed)["environment"] == {
        "pip": ["jupyterlab", "torch==2.13.0"],
        "python": "3.11",
    }


def test_env_reads_a_requirements_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "requirements.txt").write_text("# mine\njupyterlab>=4\n\nnumpy\n")
    assert dev_cli.environment_of("requirements.txt", None) == {"pip": ["jupyterlab>=4", "numpy"]}
    (tmp_path / "bad.txt").write_text("--index-url https://elsewhere\n")
    with pytest.raises(CliError):
        dev_cli.environment_of("bad.txt", None)


class FakeClient:
    server = "http://gpuyard:8080"

    def answer(self, model, method, path):
        assert (method, path) == ("GET", "/v1/dev/3f2a")
        return model(
            job_id="3f2a9c", name="explore", tenant="vision", state="running", url="/dev/3f2a9c/lab", gpus=0.5
        )


@pytest.mark.parametrize(("display", "opened"), [(None, []), (":0", ["http://gpuyard:8080/dev/3f2a9c/lab"])])
def test_open_prints_the_url_and_opens_a_browser_only_with_a_display(monkeypatch, capsys, display, opened):
    seen: list[str] = []
    monkeypatch.setattr(dev_cli, "api_client", lambda args: FakeClient())
    monkeypatch.setattr(dev_cli.webbrowser, "open", seen.append)
    monkeypatch.setattr(dev_cli.sys, "platform", "linux")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    if display:
        monkeypatch.setenv("DISPLAY", display)
    else:
        monkeypatch.delenv("DISPLAY", raising=False)
    assert dev_cli.cmd_open(parsed("open", "3f2a")) == 0
    assert "http://gpuyard:8080/dev/3f2a9c/lab" in capsys.readouterr().out
    assert seen == opened
