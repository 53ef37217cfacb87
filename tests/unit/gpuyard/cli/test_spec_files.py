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
    ("broken.yaml", b"command: x\nresources: [\n  gpus: 2\n", "line 4, column 1: not valid YAML"),
    ("tab.yaml", b"command: x\n\tresources: {}\n", "line 2, column 1: not valid YAML: found character"),
    ("broken.json", b'{"command": "x",\n "resources": {gpus: 1}}', "line 2, column 16: not valid JSON"),
    ("typo.yaml", b"command: x\nresources:\n  gpu: 2\n", "resources.gpu: Extra inputs are not permitted"),
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


def error_of(tmp_path, capsys, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    assert cli.main(["submit", str(path)]) == 1
    return capsys.readouterr().err.strip().removeprefix(f"error: {path}")


def test_a_yaml_error_names_the_file_where_and_why_in_one_line(tmp_path, capsys):
    said = error_of(tmp_path, capsys, "job.yaml", b"command: x\nresources: [\n  gpus: 2\n")
    assert said == (
        ", line 4, column 1: not valid YAML: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence from line 2, column 12)"
    )
    assert "unicode string" not in error_of(tmp_path, capsys, "job.yaml", b"a: b: c\n")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b"command: x\nresources:\n  gpu: 2\n",
            "resources.gpu: Extra inputs are not permitted; did you mean `gpus`?",
        ),
        (b"command: x\nreplica: 2\n", "replica: Extra inputs are not permitted; did you mean `replicas`?"),
        (b"comand: x\n", "comand: Extra inputs are not permitted; did you mean `command`?"),
        (
            b"command: x\nresources: {gpus: 1, zzz: 1}\n",
            "resources.zzz: Extra inputs are not permitted; the fields here are gpus, gpu_memory, gpu_model, "
            "cpus, memory",
        ),
    ],
)
def test_an_unknown_field_is_told_the_closest_known_one(tmp_path, capsys, content, said):
    assert error_of(tmp_path, capsys, "job.yaml", content) == f": {said}"


def test_an_unknown_field_beside_other_errors_keeps_them_all(tmp_path, capsys):
    said = error_of(tmp_path, capsys, "job.yaml", b"command: x\nresources: {gpu: 1, gpus: 1.5}\nfoo: 1\n")
    assert "resources.gpus: more than one GPU must be a whole number" in said
    assert "resources.gpu: Extra inputs are not permitted; did you mean `gpus`?" in said
    assert "foo: Extra inputs are not permitted; the fields here are name, tenant, command" in said
