"""The exec protocol's frames (gpuyard.shared.contracts.api.access): what the caller's first frame and control
frames may say, and how an exit is told."""

from __future__ import annotations

import pytest

from gpuyard.shared.contracts.api.access import (
    DEFAULT_SIZE,
    ExecStart,
    ProtocolError,
    data_frame,
    exit_code,
    parse_control,
    parse_start,
)


def test_a_start_frame_round_trips_and_a_terminal_alone_may_start_a_shell():
    start = ExecStart(argv=["python", "-c", "print(1)"], size=(120, 40), stdin=True, term="xterm")
    assert parse_start(start.to_json(), tty=False) == start
    shell = parse_start("{}", tty=True)
    assert (shell.argv, shell.size, shell.stdin, shell.words) == ([], DEFAULT_SIZE, True, "shell")
    with pytest.raises(ProtocolError, match="only a terminal"):
        parse_start("{}", tty=False)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"argv": "ls"}',
        '{"argv": [1]}',
        '{"argv": ["a\\u0000b"]}',
        '{"argv": ["ls"], "size": [0, 10]}',
        '{"argv": ["ls"], "size": [true, 10]}',
        '{"argv": ["ls"], "size": [80]}',
        '{"argv": ["ls"], "term": "x\\ny"}',
        '{"argv": ' + str(["x"] * 300).replace("'", '"') + "}",
    ],
)
def test_a_start_frame_that_breaks_a_rule_is_refused_with_it(text):
    with pytest.raises(ProtocolError):
        parse_start(text, tty=False)


def test_control_frames_resize_or_end_the_input_and_nothing_else():
    assert parse_control('{"resize": [100, 30]}').resize == (100, 30)
    assert parse_control('{"eof": true}').eof
    for text in ('{"signal": "INT"}', '{"resize": [1, 99999]}', '{"eof": 1}'):
        with pytest.raises(ProtocolError):
            parse_control(text)


def test_data_frames_name_their_stream_and_exits_read_as_a_shell_says_them():
    assert data_frame(1, b"hi") == b"\x01hi"
    assert (exit_code(0), exit_code(3), exit_code(-9)) == (0, 3, 137)
