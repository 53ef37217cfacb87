"""`gpuyard exec`, `shell` and `port-forward` (gpuyard/cli/access.py, gpuyard/access.py) without a platform: the
command after `--` and the options before it, a request's head as the port-forward sends it on, one-line errors."""

from __future__ import annotations

import pytest

from gpuyard.access import exec_url, refusal_words, rewrite_head
from gpuyard.cli import build_parser, main
from gpuyard.cli.access import command_of
from gpuyard.cli.common import CliError


def parsed(*argv: str):
    args = build_parser().parse_args(list(argv))
    return args, command_of(args)


def test_exec_reads_its_options_after_the_job_and_the_command_after_the_dashes():
    args, argv = parsed("exec", "3f2a", "--replica", "2", "-i", "--", "sh", "-c", "echo --x; exit 3")
    assert (args.job, args.replica, args.stdin, argv) == ("3f2a", 2, True, ["sh", "-c", "echo --x; exit 3"])
    args, argv = parsed("exec", "--replica", "1", "3f2a", "--", "ls", "-l")
    assert (args.replica, argv) == (1, ["ls", "-l"])
    assert parsed("exec", "3f2a", "nvidia-smi")[1] == ["nvidia-smi"]
    with pytest.raises(CliError, match="give the command after --"):
        parsed("exec", "3f2a", "--")
    with pytest.raises(CliError, match="unknown options before --: --bogus"):
        parsed("exec", "3f2a", "--bogus", "--", "true")


def test_a_refused_exec_is_one_line_and_no_traceback(capsys):
    assert main(["exec", "3f2a", "--server", "http://127.0.0.1:9", "--token", "t", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach GPUYARD at http://127.0.0.1:9") and "Traceback" not in err
    assert main(["port-forward", "3f2a", "0"]) == 1
    assert "a port is a number from 1 to 65535" in capsys.readouterr().err


def test_the_exec_url_and_a_refusals_words():
    assert exec_url("https://api.example/", "a b", replica=1, tty=True) == (
        "wss://api.example/v1/jobs/a%20b/exec?replica=1&tty=1"
    )
    assert refusal_words(409, b'{"detail": "job x is queued"}') == "job x is queued (409)"
    assert refusal_words(502, b"bad gateway") == "bad gateway (502)"


def test_a_forwarded_request_goes_under_the_jobs_port_with_the_token_and_one_request_per_connection():
    head = (
        b"GET /data/run?x=1 HTTP/1.1\r\nHost: localhost:16006\r\nConnection: keep-alive\r\n"
        b"Authorization: Basic secret\r\nAccept: */*"
    )
    sent = rewrite_head(head, "/jobs/j1/ports/6006", "api:8080", "tok").decode()
    assert sent.startswith("GET /jobs/j1/ports/6006/data/run?x=1 HTTP/1.1\r\n")
    assert "Host: api:8080" in sent and "Connection: close" in sent and "Authorization: Bearer tok" in sent
    assert "Basic secret" not in sent and "keep-alive" not in sent and sent.endswith("\r\n\r\n")
    upgrade = rewrite_head(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade", "/p", "h", None)
    assert b"Connection: Upgrade" in upgrade and b"Authorization" not in upgrade
    with pytest.raises(ValueError):
        rewrite_head(b"GET http://elsewhere/ HTTP/1.1", "/p", "h", None)
