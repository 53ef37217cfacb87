"""The CLI's contexts (gpuyard/contexts.py): one per platform `gpuyard up` ran, by data dir, one of them current;
`gpuyard context ls|use|rm`; `--context` and GPUYARD_CONTEXT for one command; an unreachable server named with its
context; an older config.json read as one context and rewritten."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from gpuyard import cli, client, contexts
from gpuyard.client import Client, ClientError
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.supervisor.datadir import ensure_admin_token, save_context


@pytest.fixture
def config(tmp_path, monkeypatch):
    """The CLI's config dir and a home of its own (the default data dir under it); no GPUYARD_* of the shell."""
    for name in [n for n in os.environ if n.startswith("GPUYARD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home" / "share"))
    monkeypatch.setenv("GPUYARD_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


def saved(config) -> dict:
    return json.loads((config / "config.json").read_text())


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_two_data_dirs_are_two_contexts_and_the_last_up_is_current(config, tmp_path):
    first, trial = tmp_path / "gpuyard", tmp_path / "trial"
    save_context(first, "http://127.0.0.1:8080", "gy_first")
    context, path = save_context(trial, "http://127.0.0.1:8081", "gy_trial")
    assert (context.name, path) == ("trial", config / "config.json")
    assert saved(config) == {
        "current": "trial",
        "contexts": {
            "gpuyard": {"server": "http://127.0.0.1:8080", "token": "gy_first", "data_dir": str(first)},
            "trial": {"server": "http://127.0.0.1:8081", "token": "gy_trial", "data_dir": str(trial)},
        },
        "server": "http://127.0.0.1:8081",  # the current one's, for scripts that read config.json
        "token": "gy_trial",
    }
    again, _ = save_context(first, "http://127.0.0.1:9090", "gy_first")  # its entry, updated: no third one
    assert again.name == "gpuyard" and saved(config)["current"] == "gpuyard"
    assert len(saved(config)["contexts"]) == 2 and saved(config)["server"] == "http://127.0.0.1:9090"
    assert stat.S_IMODE((config / "config.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700


def test_a_context_is_named_default_for_the_default_data_dir_and_apart_from_others_of_one_name(
    config, tmp_path
):
    default = contexts.default_data_dir().resolve()
    assert save_context(default, "http://127.0.0.1:8080", "gy_a")[0].name == "default"
    assert save_context(tmp_path / "a" / "data", "http://127.0.0.1:1", "gy_b")[0].name == "data"
    assert save_context(tmp_path / "b" / "data", "http://127.0.0.1:2", "gy_c")[0].name == "data-2"
    assert save_context(tmp_path / "my data!", "http://127.0.0.1:3", "gy_d")[0].name == "my-data"


def test_the_cli_talks_to_the_current_context_or_the_one_asked_for(config, tmp_path, monkeypatch):
    save_context(tmp_path / "one", "http://127.0.0.1:1001", "gy_one")
    save_context(tmp_path / "two", "http://127.0.0.1:1002", "gy_two")
    assert (Client().server, Client().token) == ("http://127.0.0.1:1002", "gy_two")
    assert (Client(context="one").server, Client(context="one").token) == ("http://127.0.0.1:1001", "gy_one")
    monkeypatch.setenv("GPUYARD_CONTEXT", "one")
    assert Client().server == "http://127.0.0.1:1001"
    assert Client(context="two").server == "http://127.0.0.1:1002"  # --context over the variable
    monkeypatch.setenv("GPUYARD_SERVER", "http://elsewhere:1")
    assert (Client().server, Client().token) == ("http://elsewhere:1", "gy_one")  # the variable, per field
    monkeypatch.setenv("GPUYARD_CONTEXT", "three")
    with pytest.raises(ClientError, match="no context 'three': `gpuyard context ls` lists them"):
        Client()
    assert Client("http://given:1", "gy_given").server == "http://given:1"  # (no context asked for: `up`'s)


def test_context_ls_use_and_rm(config, tmp_path, capsys):
    save_context(tmp_path / "one", "http://127.0.0.1:1001", "gy_one")
    save_context(tmp_path / "two", "http://127.0.0.1:1002", "gy_two")
    code, out, _ = run(capsys, "context", "ls")
    table = [line.split() for line in out.splitlines()]
    assert code == 0 and table == [
        ["CURRENT", "NAME", "SERVER", "DATA", "DIR"],
        ["one", "http://127.0.0.1:1001", str(tmp_path / "one")],
        ["*", "two", "http://127.0.0.1:1002", str(tmp_path / "two")],
    ]
    assert "gy_" not in out  # never a token
    assert run(capsys, "context", "use", "one")[:2] == (
        0,
        "now talking to http://127.0.0.1:1001 (context 'one')\n",
    )
    assert saved(config)["current"] == "one" and saved(config)["token"] == "gy_one"
    listed = json.loads(run(capsys, "context", "ls", "--json")[1])
    assert [(c["name"], c["current"]) for c in listed] == [("one", True), ("two", False)]
    code, _, err = run(capsys, "context", "use", "three")
    assert code == 1 and err.strip() == "error: no context 'three': `gpuyard context ls` lists them"
    code, out, _ = run(capsys, "context", "rm", "one")
    assert code == 0 and "no context is current now" in out
    assert list(saved(config)["contexts"]) == ["two"] and saved(config)["current"] is None
    assert "token" not in saved(config)


def test_no_context_yet_is_said_by_ls(config, capsys):
    code, out, _ = run(capsys, "context", "ls")
    assert code == 0 and out.startswith("no contexts in ") and "`gpuyard up` saves one" in out


@pytest.fixture
def refused_port():
    """A port bound and not listening: a connection to it is refused, at once and for sure."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_an_unreachable_server_is_one_line_naming_its_context_and_how_to_switch(
    config, tmp_path, capsys, monkeypatch, refused_port
):
    monkeypatch.setattr(client, "BACKOFF", 0)  # its retries, without their waits
    save_context(tmp_path / "trial", f"http://127.0.0.1:{refused_port}", "gy_trial")
    save_context(tmp_path / "live", "http://127.0.0.1:1", "gy_live")
    code, _, err = run(capsys, "ps", "--context", "trial")
    assert code == 1 and err.count("\n") == 1, err
    assert err.strip() == (
        f"error: cannot reach GPUYARD at http://127.0.0.1:{refused_port}, the server of context 'trial': is its "
        "`gpuyard up` running? `gpuyard context ls` lists the platforms this CLI knows, `gpuyard context use "
        "NAME` switches"
    )
    monkeypatch.setenv("GPUYARD_SERVER", f"http://127.0.0.1:{refused_port}")
    code, _, err = run(capsys, "ps")
    assert err.strip() == (
        f"error: cannot reach GPUYARD at http://127.0.0.1:{refused_port} (GPUYARD_SERVER): is `gpuyard up` running?"
    )


def test_an_older_config_is_the_default_data_dirs_context_when_its_tokens_take_the_token(config):
    default = contexts.default_data_dir().resolve()
    default.mkdir(parents=True)
    token, _ = ensure_admin_token(default, [])
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"server": "http://127.0.0.1:8080", "token": token}))
    chosen = Client()
    assert (chosen.server, chosen.token, chosen.context.name) == ("http://127.0.0.1:8080", token, "default")
    assert saved(config)["contexts"] == {  # rewritten once, in the new form
        "default": {"server": "http://127.0.0.1:8080", "token": token, "data_dir": str(default)}
    }
    assert saved(config)["current"] == "default" and saved(config)["token"] == token
    assert stat.S_IMODE((config / "config.json").stat().st_mode) == 0o600
    assert ensure_admin_token(default, contexts.load().saved_tokens(default)) == (token, False)  # kept


def test_an_older_config_of_another_data_dir_is_made_its_own_by_the_up_that_takes_its_token(config, tmp_path):
    trial = tmp_path / "trial"
    trial.mkdir()
    token, _ = ensure_admin_token(trial, [])
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"server": "http://127.0.0.1:8081", "token": token}))
    assert contexts.load().pick().name == "127.0.0.1-8081"  # its data dir is not known yet
    assert ensure_admin_token(trial, contexts.load().saved_tokens(trial)) == (token, False)
    context, _ = save_context(trial, "http://127.0.0.1:8081", token)
    assert (context.name, context.data_dir) == ("127.0.0.1-8081", str(trial))
    assert len(saved(config)["contexts"]) == 1
    assert len(Tokens(trial / "tokens.json").entries()) == 1  # no second admin token


def test_the_trial_of_another_data_dir_leaves_the_first_platforms_token_as_it_was(config, tmp_path):
    """`gpuyard up` on the first data dir, a trial on another, the first again: its token is the same, each
    tokens file holds one admin token, and the first is current again."""
    first, trial = tmp_path / "first", tmp_path / "trial"
    tokens = {}
    for data_dir, port in ((first, 8080), (trial, 8081), (first, 8080)):
        data_dir.mkdir(exist_ok=True)
        token, _ = ensure_admin_token(data_dir, contexts.load().saved_tokens(data_dir))
        save_context(data_dir, f"http://127.0.0.1:{port}", token)
        tokens.setdefault(data_dir, set()).add(token)
    assert [len(tokens[first]), len(tokens[trial])] == [1, 1] and tokens[first] != tokens[trial]
    assert len(Tokens(first / "tokens.json").entries()) == len(Tokens(trial / "tokens.json").entries()) == 1
    assert saved(config)["current"] == "first" and saved(config)["token"] in tokens[first]
