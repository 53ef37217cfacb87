"""Real `gpuyard up` runs sharing one CLI config dir: a platform restarted on its data dir keeps its admin token,
a trial on another data dir gets a context of its own and leaves the first one's as it was, and the CLI says
which context it could not reach."""

from __future__ import annotations

import json

import pytest

from gpuyard.shared.auth.tokens import Tokens

from .conftest import Platform

pytestmark = pytest.mark.integration


def saved(config) -> dict:
    return json.loads((config / "config.json").read_text())


def test_restarts_keep_the_admin_token_and_a_trial_elsewhere_gets_a_context_of_its_own(tmp_path):
    config = tmp_path / "config"
    first = Platform(tmp_path / "first", config, simulate_gpus=0, executors=1).start()
    token = saved(config)["token"]
    assert first.stop() == 0

    trial = Platform(tmp_path / "trial", config, simulate_gpus=0, executors=1).start()
    try:
        assert saved(config)["current"] == "trial" and saved(config)["token"] != token
        listed = trial.cli("context", "ls")
        rows = {line.split()[-3]: line for line in listed.stdout.splitlines()[1:]}
        assert set(rows) == {"first", "trial"} and rows["trial"].startswith("*"), listed.stdout
        assert trial.cli("ps").returncode == 0  # the current context: the trial
        down = trial.cli("ps", "--context", "first")
        assert down.returncode == 1 and len(down.stderr.strip().splitlines()) == 1, down.stderr
        assert f"cannot reach GPUYARD at {first.server}, the server of context 'first'" in down.stderr
        assert "`gpuyard context ls`" in down.stderr
    finally:
        assert trial.stop() == 0

    again = Platform(tmp_path / "first", config, simulate_gpus=0, executors=1).start()
    try:
        assert saved(config)["current"] == "first" and saved(config)["token"] == token  # the same token
        assert saved(config)["server"] == again.server  # (on its new port)
        tokens = Tokens(again.data_dir / "tokens.json").entries()
        assert len(tokens) == 1 and tokens[0].admin  # restarts piled up no admin token
        assert again.client().jobs().items == []
    finally:
        assert again.stop() == 0
