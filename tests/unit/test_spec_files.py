"""A job file the CLI cannot submit is one clear line and exit 1, never a traceback, whatever is in it."""

from __future__ import annotations

import pytest

from gpuyard import cli

BAD_FILES = [  # (file name, its bytes, words of the error)
    ("nul.yaml", b'command: "echo a\\0b"\n', "NUL byte"),
    ("nul-env.yaml", b'command: x\nenv: {X: "a\\0b"}\n', "NUL byte"),
    ("nan.json", b'{"command": "x", "resources": {"gpus": NaN}}', "finite number"),
    ("inf.yaml", b"command: x\nresources: {cpus: .inf}\n", "finite number"),
    ("huge.yaml", b"command: x\ntimeout: 1.0e+400\n", "finite number"),
    ("huge-memory.json", b'{"command": "x", "resources": {"memory": 1e400}}', "finite number"),
    ("surrogate.json", b'{"command": "\\ud800"}', "lone surrogate"),
    ("latin1.yaml", b"command: caf\xe9\n", "not UTF-8"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize(("name", "content", "words"), BAD_FILES)
def test_a_job_file_that_cannot_be_a_spec_is_one_line_and_exit_1(tmp_path, capsys, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    code = cli.main(["submit", str(path)])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith(f"error: {path}") and words in err
    assert len(err.strip().splitlines()) == 1
